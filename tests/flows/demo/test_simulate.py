"""Simulated production: the model really answers, the verifier decides what failed."""
import json
import random

import pytest

from flows.demo.simulate import TrafficConfig, draw_request, serve_traffic, write_landing
from tasks.round.scoring import local_client, verify_rows
from flows.demo.tiny_model import init_model
from verifiers.registry import VerifierConfig


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


@pytest.mark.slow
def test_failures_are_what_the_verifier_rejects(tmp_path):
    model = init_model(tmp_path / "untrained")  # answers at random: almost every request fails
    eval_items = [{"domain": "math", "prompt": f"What is {a}+7?", "reference": {"answer": str(a + 7)}}
                  for a in range(10, 30)]
    # a third of the requests code or JSON: the code ones are scored in the sandbox on Dask
    cfg = TrafficConfig(requests=60, math_share=0.67, backend="transformers", malformed_share=0.1,
                        repeat_share=0.1)
    traffic = serve_traffic(model, "v0", cfg, seed=3, verifiers=VerifierConfig(), eval_items=eval_items)
    assert traffic.failures == len(traffic.logs) and traffic.failures >= 50
    lo, hi = traffic.interval()
    assert lo <= traffic.failure_rate <= hi
    rates = traffic.domain_rates()
    assert sum(r["requests"] for r in rates.values()) == 60
    assert sum(r["failures"] for r in rates.values()) == traffic.failures
    assert all(r["interval"][0] <= r["failures"] / r["requests"] <= r["interval"][1] for r in rates.values())
    assert rates["code"]["requests"] > 0
    scheduler = local_client().cluster.scheduler  # the warm cluster the code rows went to
    assert any(str(key).startswith("verify-") for key, *_ in scheduler.transition_log)
    rows = [{"verifier": VerifierConfig().verifier_for(log["domain"]), "spec": log["reference"],
             "completion": log["response"]} for log in traffic.logs]
    assert not any(v.passed for v in verify_rows(rows, VerifierConfig()))
    path = write_landing(traffic.lines, tmp_path / "landing", "traffic-1")
    lines = path.read_text().splitlines()
    n = traffic.failures
    planted = round(n * 0.1) + round(n * 0.05) + min(len(eval_items), round(n * 0.03)) + round(n * 0.1)
    assert len(lines) == n + planted  # repeats, near copies, leaks and broken lines, as configured
    prompts = [json.dumps(log["messages"]) for log in traffic.logs]
    repeated = [line for line in lines if any(p in line for p in prompts)]
    assert len(repeated) > n  # the repeats carry the same conversation again
