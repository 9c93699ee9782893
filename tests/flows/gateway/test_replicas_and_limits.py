"""Request-rate limits per key, and feedback across gateway replicas: real gateways in front of
real `vllm serve`, driven by the `openai` SDK."""
from __future__ import annotations

import time

import openai
import pytest

from flows.gateway.calls import new_completion_id, replica_of
from flows.gateway.config import GatewayConfig
from flows.gateway.limits import RateLimiter
from flows.gateway.vllm_serve import free_port
from tests.flows.gateway.conftest import shipped_records, start_gateway

pytestmark = pytest.mark.timeout(600)

ASK = {"model": "flywheel", "messages": [{"role": "user", "content": "What is 1+1?"}], "max_tokens": 2}


def test_a_bucket_gives_its_burst_then_one_request_per_interval_per_key():
    now = [100.0]
    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [limiter.wait_s("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.wait_s("k") == pytest.approx(0.5)
    assert limiter.wait_s("other") == 0.0  # its own bucket
    now[0] += 0.25
    assert limiter.wait_s("k") == pytest.approx(0.25)  # a refused request takes nothing
    now[0] += 0.25
    assert limiter.wait_s("k") == 0.0 and limiter.wait_s("k") == pytest.approx(0.5)
    now[0] += 60
    assert [limiter.wait_s("k") for _ in range(4)][:3] == [0.0, 0.0, 0.0]  # refilled to the burst, not past it
    assert limiter.headers(0.2) == {"retry-after": "1", "retry-after-ms": "200"}


def test_replica_names_go_into_ids_and_bad_replica_settings_are_refused():
    assert replica_of(new_completion_id("a2")) == "a2" and replica_of(new_completion_id()) == ""
    assert len(new_completion_id()) == len("chatcmpl-") + 32
    cfg = GatewayConfig(replica="a", peers="b=http://gw-b:8100, c=https://gw-c/")
    assert cfg.peer_urls == {"b": "http://gw-b:8100", "c": "https://gw-c"}
    for bad, message in [({"replica": "A-1"}, "lowercase letters and digits"),
                         ({"replica": "a", "peers": "b=gw-b:8100"}, "name=http"),
                         ({"replica": "a", "peers": "a=http://x"}, "own replica"),
                         ({"peers": "b=http://x"}, "own `replica` name"),
                         ({"rate_limit_rps": -1}, ">= 0"),
                         ({"rate_limit_scope": "global"}, "'replica' or 'cluster'")]:
        with pytest.raises(ValueError, match=message):
            GatewayConfig(**bad)
    assert GatewayConfig(rate_limit_rps=0.5).burst == 1 and GatewayConfig(rate_limit_rps=7.2).burst == 8
    three = {"replica": "a", "peers": "b=http://gw-b:8100,c=http://gw-c:8100", "rate_limit_rps": 9}
    per_replica = GatewayConfig(**three)
    assert (per_replica.replica_rate_rps, per_replica.burst) == (9, 9)
    shared = GatewayConfig(**three, rate_limit_scope="cluster")
    assert (shared.replicas_sharing, shared.replica_rate_rps, shared.burst) == (3, 3, 3)
    assert GatewayConfig(**three, rate_limit_scope="cluster", rate_limit_burst=4).burst == 2  # rounded up
    assert GatewayConfig(rate_limit_rps=2, rate_limit_scope="cluster").replica_rate_rps == 2  # no peers: all of it


def test_a_key_past_its_rate_gets_a_429_the_sdk_waits_out(tmp_path, upstreams):
    gateway = start_gateway(tmp_path / "home", upstreams["v-a"].url,
                            env={"FLYWHEEL_GATEWAY_RATE_LIMIT_RPS": "1", "FLYWHEEL_GATEWAY_RATE_LIMIT_BURST": "2"})
    try:
        client = gateway.client()
        client.chat.completions.create(**ASK)
        client.chat.completions.create(**ASK)
        with pytest.raises(openai.RateLimitError, match="rate limit of 1 requests/s") as refused:
            client.chat.completions.create(**ASK)
        assert 1 <= int(refused.value.response.headers["retry-after"]) <= 2
        assert 0 < int(refused.value.response.headers["retry-after-ms"]) <= 1000
        gateway.client(key="sk-other-key").chat.completions.create(**ASK)  # another key, its own bucket
        t0 = time.monotonic()
        answered = gateway.client().with_options(max_retries=2).chat.completions.create(**ASK)
        assert answered.id and time.monotonic() - t0 < 10  # the SDK waited retry-after-ms, then it went
    finally:
        assert gateway.stop()
    # a refused call never reached the upstream, so it is not in the log
    assert len([r for r in shipped_records(gateway.landing) if r["type"] == "call"]) == 4


def test_a_cluster_rate_limit_is_split_between_the_replicas(tmp_path, upstreams):
    port_a, port_b = free_port(), free_port()
    limit = {"FLYWHEEL_GATEWAY_RATE_LIMIT_RPS": "0.2", "FLYWHEEL_GATEWAY_RATE_LIMIT_BURST": "2",
             "FLYWHEEL_GATEWAY_RATE_LIMIT_SCOPE": "cluster"}
    a = start_gateway(tmp_path / "a", upstreams["v-a"].url, port=port_a, env={
        **limit, "FLYWHEEL_GATEWAY_REPLICA": "a", "FLYWHEEL_GATEWAY_PEERS": f"b=http://127.0.0.1:{port_b}"})
    b = start_gateway(tmp_path / "b", upstreams["v-a"].url, port=port_b, env={
        **limit, "FLYWHEEL_GATEWAY_REPLICA": "b", "FLYWHEEL_GATEWAY_PEERS": f"a=http://127.0.0.1:{port_a}"})
    try:
        a.client().chat.completions.create(**ASK)  # the key's burst of 2 is 1 at each replica
        with pytest.raises(openai.RateLimitError, match=r"0.1 requests/s \(this replica's share of the cluster's "
                                                        r"0.2\) \(burst 1\)"):
            a.client().chat.completions.create(**ASK)
        b.client().chat.completions.create(**ASK)  # the other half, at the other replica
        with pytest.raises(openai.RateLimitError):
            b.client().chat.completions.create(**ASK)
    finally:
        assert a.stop() and b.stop()


def test_feedback_sent_to_another_replica_is_recorded_once_by_the_one_that_logged_the_call(tmp_path, upstreams):
    port_a, port_b = free_port(), free_port()
    peers = f"a=http://127.0.0.1:{port_a},b=http://127.0.0.1:{port_b}"
    a = start_gateway(tmp_path / "a", upstreams["v-a"].url, port=port_a,
                      env={"FLYWHEEL_GATEWAY_REPLICA": "a", "FLYWHEEL_GATEWAY_PEERS": peers.split(",")[1]})
    b = start_gateway(tmp_path / "b", upstreams["v-a"].url, port=port_b,
                      env={"FLYWHEEL_GATEWAY_REPLICA": "b", "FLYWHEEL_GATEWAY_PEERS": peers.split(",")[0]})
    try:
        answer = a.client().chat.completions.create(**ASK)
        assert replica_of(answer.id) == "a"
        via_b, via_a = b.client(), a.client()
        feedback = {"id": answer.id, "label": "bad", "correction": {"answer": "2"}}
        assert via_b.post("/feedback", body=feedback, cast_to=object) == {"id": answer.id, "recorded": True}
        assert via_b.post("/feedback", body=feedback, cast_to=object) == {"id": answer.id, "recorded": False}
        assert via_a.post("/feedback", body=feedback, cast_to=object) == {"id": answer.id, "recorded": False}
        with pytest.raises(openai.ConflictError, match="already recorded"):
            via_b.post("/feedback", body={**feedback, "label": "good"}, cast_to=object)
        with pytest.raises(openai.NotFoundError, match="no call with completion id"):
            via_b.post("/feedback", body={**feedback, "id": new_completion_id("a")}, cast_to=object)
        with pytest.raises(openai.NotFoundError, match="no address for"):
            via_b.post("/feedback", body={**feedback, "id": new_completion_id("c")}, cast_to=object)
        with pytest.raises(openai.AuthenticationError):  # a key b does not know goes nowhere
            b.client(key="sk-unknown").post("/feedback", body=feedback, cast_to=object)
        assert a.stop()
        with pytest.raises(openai.InternalServerError, match="could not be reached") as down:
            via_b.post("/feedback", body={**feedback, "label": "good"}, cast_to=object)
        assert down.value.status_code == 503
    finally:
        a.stop()
        assert b.stop()
    in_a = [r for r in shipped_records(a.landing) if r["type"] == "feedback"]
    assert [(r["id"], r["label"]) for r in in_a] == [(answer.id, "bad")]
    assert not shipped_records(b.landing)  # b logged no call and no feedback of its own
