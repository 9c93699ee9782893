"""`flywheel gateway` in front of real `vllm serve`, driven by the official `openai` SDK."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.flows.gateway.conftest import ADMIN_KEY, KEY, shipped_records, start_gateway
from tests.flows.keep_alive import answers_after_idle

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def gateway(tmp_path, upstreams):
    running = start_gateway(tmp_path / "home", upstreams["v-a"].url)
    yield running
    running.stop()


def test_an_idle_connection_outlives_pooled_clients_expiry(gateway, upstreams):
    """Longer idle than uvicorn's default keep-alive (5 s), as the openai SDK's pool allows:
    at the gateway and at a `vllm serve` it starts (ServedModel, as managed mode does)."""
    assert answers_after_idle(gateway.url, "/health", idle_s=6)
    assert answers_after_idle(upstreams["v-b"].url, "/health", idle_s=6)


def test_calls_streamed_or_not_are_answered_logged_and_shipped_on_a_graceful_stop(gateway):
    client = gateway.client()
    models = client.models.list()
    assert [m.id for m in models.data] == ["flywheel"]
    raw = client.chat.completions.with_raw_response.create(
        model="flywheel", messages=[{"role": "user", "content": "What is 2+3?"}], max_tokens=8, seed=1)
    answer = raw.parse()
    assert raw.headers["x-flywheel-model-version"] == "v-a"
    assert answer.id.startswith("chatcmpl-") and answer.model == "flywheel"
    chunks = list(client.chat.completions.create(
        model="flywheel", messages=[{"role": "user", "content": "What is 4+4?"}], max_tokens=8, stream=True))
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[-1].choices[0].finish_reason
    assert gateway.stop()

    records = {r["id"]: r for r in shipped_records(gateway.landing)}
    assert set(records) == {answer.id, chunks[0].id}
    plain, stream = records[answer.id], records[chunks[0].id]
    assert plain["response"]["choices"][0]["message"]["content"] == answer.choices[0].message.content
    assert stream["response"]["choices"][0]["message"]["content"] == streamed_text
    assert stream["stream"] and not plain["stream"]
    for record in (plain, stream):
        assert record["model_version"] == "v-a" and record["status"] == 200
        assert record["usage"]["completion_tokens"] >= 1 and record["latency_ms"] > 0
        assert record["request"]["messages"][0]["role"] == "user"


def test_response_format_and_tools_pass_through_to_the_upstream(gateway):
    client = gateway.client()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    answer = client.chat.completions.create(
        model="flywheel", messages=[{"role": "user", "content": "Give n."}], max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    tool = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    called = client.chat.completions.create(
        model="flywheel", messages=[{"role": "user", "content": "Add."}], max_tokens=24, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "add"}})
    gateway.stop()
    records = {r["id"]: r for r in shipped_records(gateway.landing)}
    assert records[answer.id]["request"]["response_format"]["json_schema"]["schema"] == schema
    assert records[called.id]["request"]["tools"] == [tool]
    # vLLM decoded both under the constraint the gateway passed on
    logged_calls = records[called.id]["response"]["choices"][0]["message"]["tool_calls"]
    assert logged_calls[0]["function"]["name"] == "add"
    assert called.choices[0].message.tool_calls[0].function.name == "add"


def test_keys_are_required_and_never_logged(gateway):
    with pytest.raises(openai.AuthenticationError):
        gateway.client(key="sk-wrong").chat.completions.create(
            model="flywheel", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        gateway.client(key="sk-wrong").models.list()
    gateway.client(key="sk-other-key").chat.completions.create(
        model="flywheel", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    gateway.stop()
    shipped = b"".join(p.read_bytes() for p in gateway.home.rglob("*") if p.is_file())
    assert KEY.encode() not in shipped and b"sk-other-key" not in shipped and b"sk-wrong" not in shipped
    assert len(shipped_records(gateway.landing)) == 1


def test_bad_requests_get_clear_errors_before_reaching_the_upstream(gateway):
    client = gateway.client()
    with pytest.raises(openai.APIStatusError) as too_big:
        client.chat.completions.create(model="flywheel", max_tokens=2,
                                       messages=[{"role": "user", "content": "x" * (1 << 20)}])
    assert too_big.value.status_code == 413
    with pytest.raises(openai.UnprocessableEntityError, match="non-empty list"):
        client.chat.completions.create(model="flywheel", messages=[], max_tokens=2)
    with pytest.raises(openai.UnprocessableEntityError, match="serves 'flywheel'"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    broken = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{not json",
                        headers={"Authorization": f"Bearer {KEY}"})
    assert broken.status_code == 400 and "not JSON" in broken.json()["error"]["message"]
    # the upstream's own refusal passes through with its status
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "hi " * 600}],
                                       max_tokens=8)
    gateway.stop()
    assert shipped_records(gateway.landing) == []


def test_feedback_joins_one_logged_call_and_is_idempotent(gateway):
    client = gateway.client()
    answer = client.chat.completions.create(model="flywheel", max_tokens=4,
                                            messages=[{"role": "user", "content": "What is 1+1?"}])
    feedback = {"id": answer.id, "label": "bad", "correction": {"answer": "2"}, "comment": "wrong sum"}
    assert client.post("/feedback", body=feedback, cast_to=object) == {"id": answer.id, "recorded": True}
    assert client.post("/feedback", body=feedback, cast_to=object) == {"id": answer.id, "recorded": False}
    with pytest.raises(openai.ConflictError):
        client.post("/feedback", body={**feedback, "label": "good"}, cast_to=object)
    with pytest.raises(openai.NotFoundError, match="no call with completion id"):
        client.post("/feedback", body={**feedback, "id": "chatcmpl-unknown"}, cast_to=object)
    with pytest.raises(openai.UnprocessableEntityError, match="label"):
        client.post("/feedback", body={"id": answer.id, "label": "meh"}, cast_to=object)
    with pytest.raises(openai.UnprocessableEntityError, match="check"):
        client.post("/feedback", body={"id": answer.id, "score": 0, "correction": {"tests": "assert 1",
                                                                                    "entry_point": "f"}},
                    cast_to=object)
    gateway.stop()
    records = shipped_records(gateway.landing)
    assert [r["type"] for r in records] == ["call", "feedback"]
    assert records[1]["id"] == answer.id and records[1]["correction"] == {"answer": "2"}


def test_admin_routes_need_an_admin_key_and_flush_ships_at_once(gateway, upstreams):
    response = httpx.post(f"{gateway.url}/admin/upstream", json={"url": upstreams["v-b"].url},
                          headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 401
    response = httpx.post(f"{gateway.url}/admin/upstream", json={"url": "http://127.0.0.1:9"},
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 422 and "not healthy" in json.dumps(response.json())
    assert httpx.get(f"{gateway.url}/health").json()["primary"] == "v-a"
    gateway.client().chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=2)
    assert httpx.post(f"{gateway.url}/admin/flush", headers={"Authorization": f"Bearer {KEY}"}).status_code == 401
    flushed = httpx.post(f"{gateway.url}/admin/flush", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert len(flushed.json()["shipped"]) == 1 and len(shipped_records(gateway.landing)) == 1  # before any stop


def test_signals_in_real_traffic_become_failure_logs_in_the_lake(gateway):
    """Through the whole online half: SDK -> gateway -> vllm serve -> spool -> landing ->
    `flywheel ingest` -> interactions, feedback and failure logs, and a failure rate."""
    import subprocess
    import sys

    from storage.lake import open_lake
    from storage.settings import LakeSettings
    from tasks.ingest.failure_rate import production_failure_rate

    client = gateway.client()
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    # 3 tokens cannot hold the object the schema asks for: the reply is cut, not JSON
    cut = client.chat.completions.create(
        model="flywheel", messages=[{"role": "user", "content": "A person."}], max_tokens=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    plain = [client.chat.completions.create(model="flywheel", max_tokens=4,
                                            messages=[{"role": "user", "content": f"What is {i}+{i}?"}])
             for i in range(3)]
    client.post("/feedback", body={"id": plain[0].id, "label": "bad", "correction": {"answer": "0"}},
                cast_to=object)
    client.post("/feedback", body={"id": plain[1].id, "score": 0.1, "comment": "no idea why"}, cast_to=object)
    client.post("/feedback", body={"id": plain[2].id, "label": "good"}, cast_to=object)
    assert gateway.stop()
    ingest = subprocess.run([sys.executable, "-m", "flows.cli.app", "ingest", str(gateway.landing)],
                            capture_output=True, text=True, env=gateway.env)
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr

    con = open_lake(LakeSettings(home=gateway.home), read_only=True)
    kinds = dict(con.execute("SELECT request_id, failure_kind FROM failure_logs").fetchall())
    assert kinds == {f"{cut.id}:json": "json", f"{plain[0].id}:feedback": "feedback"}
    reference = con.execute("SELECT reference FROM failure_logs WHERE failure_kind = 'json'").fetchone()[0]
    assert json.loads(reference) == {"schema": schema}
    assert con.execute("SELECT count(*) FROM interactions").fetchone()[0] == 4
    assert sorted(con.execute("SELECT negative, trainable FROM feedback").fetchall()) == [
        (False, False), (True, False), (True, True)]
    con.close()
    [rate] = production_failure_rate(LakeSettings(home=gateway.home))
    assert (rate["calls"], rate["failed"], rate["negative_without_correction"]) == (4, 3, 1)


def test_a_streamed_tool_call_is_logged_as_the_sdk_assembles_it(gateway):
    """The log of a stream must equal the chat.completion the `openai` SDK builds from the
    same chunks (its own accumulator, not ours)."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"]}}}
    with gateway.client().chat.completions.stream(
            model="flywheel", messages=[{"role": "user", "content": "Weather?"}], max_tokens=40, tools=[tool],
            tool_choice={"type": "function", "function": {"name": "lookup"}}) as stream:
        for _event in stream:
            pass
        final = stream.current_completion_snapshot  # as accumulated; a cut answer is not parsed
    gateway.stop()
    [record] = shipped_records(gateway.landing)
    logged = record["response"]["choices"][0]
    sdk = final.choices[0]
    assert record["id"] == final.id and logged["finish_reason"] == sdk.finish_reason
    assert logged["message"]["tool_calls"] and logged["message"]["tool_calls"][0]["function"]["arguments"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in logged["message"]["tool_calls"]] \
        == [(c.id, c.function.name, c.function.arguments) for c in sdk.message.tool_calls]
    assert (logged["message"]["content"] or "") == (sdk.message.content or "")


def test_a_client_hanging_up_on_a_stream_gives_its_upstream_lease_back(gateway):
    body = {"model": "flywheel", "messages": [{"role": "user", "content": "Count."}], "max_tokens": 200,
            "stream": True}
    for _ in range(3):
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}) as response:
            assert response.status_code == 200  # hang up after the headers, before any chunk
    for _ in range(150):  # 30 s: under load (two vLLM engines on 2 cores) 10 s ran out once
        if httpx.get(f"{gateway.url}/health").json()["in_flight"] == 0:
            break
        time.sleep(0.2)
    assert httpx.get(f"{gateway.url}/health").json()["in_flight"] == 0
    gateway.stop()
    assert shipped_records(gateway.landing) == []  # never answered: not logged


def test_the_gateway_refuses_to_start_without_client_keys_or_with_a_bad_setting(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "FLYWHEEL_HOME": str(tmp_path), "FLYWHEEL_CONFIG": str(tmp_path / "none.toml")}
    env.pop("FLYWHEEL_GATEWAY_KEYS", None)
    command = [sys.executable, "-m", "flows.cli.app", "gateway", "--upstream", "http://127.0.0.1:9"]
    no_keys = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert no_keys.returncode == 2 and "FLYWHEEL_GATEWAY_KEYS" in no_keys.stderr
    bad = subprocess.run(command, capture_output=True, text=True, timeout=120,
                         env={**env, "FLYWHEEL_GATEWAY_KEYS": "k", "FLYWHEEL_GATEWAY_CANARY_SHARE": "1.5"})
    assert bad.returncode == 2 and "canary_share" in bad.stderr
