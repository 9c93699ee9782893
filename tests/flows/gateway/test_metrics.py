"""`GET /metrics`: every call counted once at its end, as an operator's Prometheus scrapes it."""
from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.flows.gateway.conftest import ADMIN_KEY, KEY, start_gateway, start_upstream_script
from tests.flows.gateway.vllm_like_upstream import RESPONSE_USAGE, USAGE


def scrape(url: str, **headers) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape, parsed as Prometheus does."""
    response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    response.raise_for_status()
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def total(samples: dict, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and labels.items() <= dict(sample_labels).items())


@pytest.fixture
def like(tmp_path):
    process, url = start_upstream_script("tests.flows.gateway.vllm_like_upstream", "v-like")
    gateway = start_gateway(tmp_path / "home", url)
    yield gateway
    gateway.stop()
    process.kill()
    process.wait(10)


def test_each_call_is_counted_once_by_api_status_and_version_with_its_latency_tokens_and_the_spool(like):
    client = like.client()
    ask = {"model": "flywheel", "messages": [{"role": "user", "content": "hi"}]}
    answered = [client.chat.completions.create(**ask).id for _ in range(3)]
    for _ in range(2):
        chunks = list(client.chat.completions.create(**ask, stream=True))
        answered.append(chunks[0].id)
    answered.append(client.responses.create(model="flywheel", input="hi").id)
    answered.append([e for e in client.responses.create(model="flywheel", input="hi", stream=True)][-1].response.id)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="flywheel", messages=[])
    with pytest.raises(openai.AuthenticationError):
        like.client(key="sk-nobody").chat.completions.create(**ask)
    for completion_id, label in zip(answered[:2], ("good", "bad")):
        assert httpx.post(f"{like.url}/v1/feedback", json={"id": completion_id, "label": label},
                          headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    httpx.post(f"{like.url}/v1/feedback", json={"id": answered[2], "score": 0.2},
               headers={"authorization": f"Bearer {KEY}"}).raise_for_status()

    seen = scrape(like.url)
    calls = {dict(labels)["api"] + "/" + dict(labels)["stream"] + "/" + dict(labels)["status"] + "/"
             + dict(labels)["version"]: value for (name, labels), value in seen.items()
             if name == "flywheel_gateway_calls_total"}
    assert calls == {"chat/false/200/v-like": 3, "chat/true/200/v-like": 2, "responses/false/200/v-like": 1,
                     "responses/true/200/v-like": 1, "chat/false/422/": 1, "chat/false/401/": 1}
    # the latency of every call that reached the upstream, once; time to first byte of each stream
    assert total(seen, "flywheel_gateway_call_seconds_count", version="v-like") == 7
    assert total(seen, "flywheel_gateway_call_seconds_count", api="chat", stream="true") == 2
    assert total(seen, "flywheel_gateway_first_byte_seconds_count", api="chat") == 2
    assert total(seen, "flywheel_gateway_first_byte_seconds_count", api="responses") == 1
    assert total(seen, "flywheel_gateway_call_seconds_bucket", le="+Inf") == 7
    assert total(seen, "flywheel_gateway_tokens_total", kind="prompt", version="v-like") == (
        5 * USAGE["prompt_tokens"] + 2 * RESPONSE_USAGE["input_tokens"])
    assert total(seen, "flywheel_gateway_tokens_total", kind="completion", version="v-like") == (
        5 * USAGE["completion_tokens"] + 2 * RESPONSE_USAGE["output_tokens"])
    assert total(seen, "flywheel_gateway_feedback_total", label="good", negative="false") == 1
    assert total(seen, "flywheel_gateway_feedback_total", label="bad", negative="true") == 1
    assert total(seen, "flywheel_gateway_feedback_total", label="none", negative="true") == 1
    assert total(seen, "flywheel_gateway_feedback_requests_total", status="200") == 3
    assert total(seen, "flywheel_gateway_in_flight", role="primary", version="v-like") == 0
    assert ("flywheel_gateway_in_flight", (("role", "primary"), ("version", "v-like"))) in seen
    assert total(seen, "flywheel_gateway_upstream_errors_total") == 0
    # 7 calls and 3 feedback wait in the spool (shipped by age after 60 s) ...
    assert total(seen, "flywheel_gateway_spool_unshipped_records") == 10
    assert total(seen, "flywheel_gateway_spool_unshipped_bytes") > 1000
    assert total(seen, "flywheel_gateway_spool_oldest_unshipped_age_seconds") > 0
    assert total(seen, "flywheel_gateway_batches_shipped_total") == 0

    httpx.post(f"{like.url}/admin/flush", headers={"authorization": f"Bearer {ADMIN_KEY}"}).raise_for_status()
    after = scrape(like.url)  # ... until flushed
    assert total(after, "flywheel_gateway_spool_unshipped_records") == 0
    assert total(after, "flywheel_gateway_spool_unshipped_bytes") == 0
    assert total(after, "flywheel_gateway_spool_oldest_unshipped_age_seconds") == 0
    assert total(after, "flywheel_gateway_batches_shipped_total") == 1
    assert total(after, "flywheel_gateway_shipping_failures_total") == 0
    assert total(after, "flywheel_gateway_calls_total") == 9  # a scrape is no call


def test_upstream_failures_fallbacks_and_rate_limits_are_counted_where_they_happened(tmp_path):
    """A call sent on from a dead canary is one call, of the version that answered; the
    dead one's failure is a fallback. A reply that is no JSON, an error mid-stream, a key
    past its rate: each once, by kind."""
    faulty, primary_url = start_upstream_script("tests.flows.gateway.faulty_upstream", "v-main")
    canary, canary_url = start_upstream_script("tests.flows.gateway.vllm_like_upstream", "v-canary")
    gateway = start_gateway(tmp_path / "home", primary_url,
                            env={"FLYWHEEL_GATEWAY_RATE_LIMIT_RPS": "0.001", "FLYWHEEL_GATEWAY_RATE_LIMIT_BURST": "8"})
    try:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        httpx.post(f"{gateway.url}/admin/upstream", json={"url": canary_url, "canary_share": 0.9},
                   headers=admin, timeout=30).raise_for_status()
        canary.kill()
        canary.wait(10)
        client = gateway.client()
        for k in range(6):
            raw = client.chat.completions.with_raw_response.create(
                model="flywheel", messages=[{"role": "user", "content": f"call {k}"}])
            assert raw.headers["x-flywheel-model-version"] == "v-main"
        with pytest.raises(openai.APIStatusError) as bad_reply:
            client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "not-json"}])
        with pytest.raises(openai.APIError):
            list(client.chat.completions.create(model="flywheel", stream=True,
                                                messages=[{"role": "user", "content": "stream-error"}]))
        with pytest.raises(openai.RateLimitError):  # the 9th request of a burst of 8
            client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "one more"}])
        seen = scrape(gateway.url)
    finally:
        gateway.stop()
        faulty.kill()
        faulty.wait(10)
    assert bad_reply.value.status_code == 502
    fallbacks = total(seen, "flywheel_gateway_fallbacks_total", version="v-canary")
    assert fallbacks >= 1  # 0.9 of 8 calls; none only by a 1e-8 chance
    assert total(seen, "flywheel_gateway_upstream_errors_total", version="v-canary", error="ConnectError") == fallbacks
    assert total(seen, "flywheel_gateway_calls_total") == 9
    assert total(seen, "flywheel_gateway_calls_total", status="200", version="v-main") == 6
    assert total(seen, "flywheel_gateway_calls_total", status="502", version="v-main", stream="false") == 1
    assert total(seen, "flywheel_gateway_calls_total", status="502", version="v-main", stream="true") == 1
    assert total(seen, "flywheel_gateway_calls_total", status="429", version="") == 1
    assert total(seen, "flywheel_gateway_upstream_errors_total", version="v-main", error="JSONDecodeError") == 1
    assert total(seen, "flywheel_gateway_upstream_errors_total", version="v-main", error="error_event") == 1
    assert total(seen, "flywheel_gateway_rate_limited_total", api="chat") == 1
    assert total(seen, "flywheel_gateway_swaps_total", kind="canary") == 1
    assert total(seen, "flywheel_gateway_in_flight", role="canary", version="v-canary") == 0
    assert total(seen, "flywheel_gateway_call_seconds_count") == 8


def test_metrics_need_an_admin_key_when_not_public(tmp_path):
    process, url = start_upstream_script("tests.flows.gateway.vllm_like_upstream", "v-like")
    gateway = start_gateway(tmp_path / "home", url, env={"FLYWHEEL_GATEWAY_METRICS_PUBLIC": "false"})
    try:
        assert httpx.get(f"{gateway.url}/metrics").status_code == 401
        assert httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {KEY}"}).status_code == 401
        assert scrape(gateway.url, authorization=f"Bearer {ADMIN_KEY}")[
            ("flywheel_gateway_in_flight", (("role", "primary"), ("version", "v-like")))] == 0
    finally:
        gateway.stop()
        process.kill()
        process.wait(10)
