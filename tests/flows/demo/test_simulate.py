"""The simulated users: what they ask, and what their feedback makes of a wrong answer."""
import json
import random

import pytest

from flows.demo.data.domains import DOMAINS, sample_task
from flows.demo.simulate import (TrafficConfig, chat_request, draw_request, feedback_body, planted_lines,
                                 wilson_interval)
from flows.demo.tiny_model import init_model
from tasks.ingest.signals import feedback_failure
from trainer.engine import EngineConfig
from verifiers.registry import VERIFIERS, VerifierConfig, self_test
from verifiers.verdict import Verdict, failed


def test_request_mix_follows_the_config():
    rng = random.Random(0)
    cfg = TrafficConfig(math_share=0.9, addition_share=0.7)
    drawn = [draw_request(cfg, rng) for _ in range(3000)]
    sums = sum(t["domain"] == "math" and t["key"][0] == "add" for t in drawn) / len(drawn)
    other_math = sum(t["domain"] == "math" and t["key"][0] != "add" for t in drawn) / len(drawn)
    assert abs(sums - 0.63) < 0.03 and abs(other_math - 0.27) < 0.03
    assert {t["domain"] for t in drawn} == {"math", "code", "json"}


def test_bad_shares_are_refused():
    with pytest.raises(ValueError, match="shares are fractions"):
        TrafficConfig(addition_share=1.5)
    with pytest.raises(ValueError, match="shares are fractions"):
        TrafficConfig(good_share=-0.1)


def test_a_request_carries_its_budget_tags_and_a_json_tasks_schema(tmp_path):
    engine = TrafficConfig(max_tokens_by_domain={"json": 112}).engine(init_model(tmp_path / "model"))
    rng = random.Random(1)
    task = sample_task("json", rng)
    request = chat_request(task, engine, tags={"serve": "2"})
    assert request["messages"] == [{"role": "user", "content": task["prompt"]}]
    assert (request["max_tokens"], request["temperature"]) == (112, 0.3) and "seed" not in request
    assert request["metadata"] == {"domain": "json", "serve": "2"}
    assert request["response_format"]["json_schema"]["schema"] == task["reference"]["schema"]
    assert "response_format" not in chat_request(sample_task("math", rng), engine, {})


@pytest.mark.parametrize("domain", DOMAINS)
def test_a_wrong_answers_feedback_becomes_a_failure_log_its_verifier_can_score(domain):
    """The correction a user sends is the task's reference again, once ingest has derived
    the failure log from it: the verifier takes it, and its gold answer passes."""
    task = sample_task(domain, random.Random(3))
    engine = EngineConfig(max_tokens=100, temperature=0.3)
    request = chat_request(task, engine, tags={"serve": "1"})
    call = {"type": "call", "id": "chatcmpl-1", "ts": "2026-12-01T10:00:00Z", "model_version": "v1", "status": 200,
            "request": request, "response": {"choices": [{"message": {"role": "assistant", "content": "no"}}]}}
    body = feedback_body(task, "chatcmpl-1", failed("wrong", "expected something else"), random.Random(0), 0.0)
    assert body["label"] == "bad" and body["id"] == "chatcmpl-1"
    log = feedback_failure({**body, "type": "feedback", "ts": call["ts"]}, call, DOMAINS)
    assert log["domain"] == domain and log["failure"]["kind"] == "feedback"
    verifier = VerifierConfig().verifier_for(domain)
    assert VERIFIERS[verifier].reference_problem(log["reference"]) is None
    if domain == "json":
        assert log["reference"] == {"schema": task["reference"]["schema"], "answer": json.loads(task["gold"])}
    else:
        assert log["reference"] == task["reference"]
    assert self_test(verifier, log["reference"]).passed


def test_users_thumb_up_a_share_of_passing_answers_and_say_nothing_of_the_rest():
    rng, task, passed = random.Random(0), sample_task("math", random.Random(0)), Verdict(1.0, True, "ok")
    said = [feedback_body(task, f"chatcmpl-{i}", passed, rng, 0.1) for i in range(2000)]
    good = [body for body in said if body is not None]
    assert all(body["label"] == "good" and "correction" not in body for body in good)
    assert 150 < len(good) < 250


def test_planted_lines_copy_the_failures_and_add_leaks_and_broken_lines():
    rng = random.Random(0)
    logs = [{"id": f"req-{i}", "ts": "2026-12-01T10:00:00Z", "model": "v1", "domain": "math",
             "messages": [{"role": "user", "content": f"What is {i}+{i + 1}? Answer with the number only."}],
             "response": "3", "failure": {"kind": "wrong", "detail": ""}, "reference": {"answer": str(2 * i + 1)},
             "meta": {}} for i in range(100)]
    eval_items = [{"domain": "math", "prompt": f"What is {a}+7?", "reference": {"answer": str(a + 7)}}
                  for a in range(10, 30)]
    cfg = TrafficConfig(repeat_share=0.1, near_duplicate_share=0.05, leak_share=0.03, malformed_share=0.1)
    lines = planted_lines(logs, cfg, rng, eval_items)
    assert len(lines) == 10 + 5 + 3 + 10  # the failures themselves are not among them
    parsed = [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]
    prompts = {json.dumps(log["messages"]) for log in logs}
    assert sum(json.dumps(p.get("messages")) in prompts for p in parsed if isinstance(p, dict)) >= 10
    assert sum(any(f"{a}+7" in line for a in range(10, 30)) for line in lines) >= 3
    assert planted_lines([], cfg, rng, eval_items) == []


def test_the_wilson_interval_holds_the_rate():
    assert wilson_interval(0, 50)[0] == 0.0 and wilson_interval(50, 50)[1] == 1.0
    low, high = wilson_interval(500, 1000)
    assert low < 0.5 < high and high - low == pytest.approx(0.062, abs=0.002)
