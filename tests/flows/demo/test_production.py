"""The demo's production path: requests through `flywheel gateway` (managed mode, its own
`vllm serve`), the users' feedback, and the failures in the lake only by way of the
gateway's logs, beside the planted file."""
import json

import pytest

from flows.demo.production import measured_rates, running_gateway, serve_traffic
from flows.demo.simulate import TrafficConfig, write_landing
from flows.demo.tiny_model import init_model
from storage.lake import open_lake
from storage.settings import LakeSettings
from tasks.ingest import batch
from tasks.ingest.batch import IngestConfig
from tasks.release.models import register_model
from tasks.round.scoring import local_client
from tasks.stages import StageKey
from verifiers.registry import VerifierConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_served_failures_reach_the_lake_through_the_gateway_and_two_serves_of_one_version_stay_apart(
        tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(home / "flywheel.toml"))
    settings = LakeSettings(home=home)
    model = init_model(tmp_path / "untrained")  # answers at random: almost every request fails
    con = open_lake(settings)
    version = register_model(con, settings, model, "test")
    con.close()
    eval_items = [{"domain": "math", "prompt": f"What is {a}+7?", "reference": {"answer": str(a + 7)}}
                  for a in range(10, 30)]
    # a third of the requests code or JSON: the code ones are scored in the sandbox on Dask
    cfg = TrafficConfig(requests=30, math_share=0.67, max_tokens_by_domain={"code": 160, "json": 112},
                        good_share=1.0, repeat_share=0.1, malformed_share=0.1)
    with running_gateway(settings, home / "flywheel.toml", 512) as gateway:
        assert gateway.health()["primary"] == version and gateway.wait_for(version) < 1
        first = serve_traffic(gateway, model, version, cfg, 1, VerifierConfig(), eval_items)
        second = serve_traffic(gateway, model, version, cfg, 2, VerifierConfig(), eval_items)
    assert gateway.process.returncode is not None  # stopped, its `vllm serve` with it
    assert first.failures >= 20 and second.failures >= 20
    planted = write_landing(first.lines, home / "landing", "planted-1")
    con = open_lake(settings)
    counts = batch.run(con, IngestConfig(), StageKey("c1"))
    assert counts["interactions"] == 60 and counts["feedback"] == 60  # good_share 1: every answer judged

    sources = dict(con.execute("SELECT batch_id, source_uri FROM lake.ingest_batches").fetchall())
    logs = con.execute("SELECT batch_id, failure_kind, meta FROM lake.failure_logs").fetchall()
    from_gateway = [(kind, json.loads(meta)) for batch_id, kind, meta in logs
                    if sources[batch_id].endswith("#signals")]
    from_planted = [kind for batch_id, kind, _ in logs if sources[batch_id] == str(planted)]
    assert len(from_gateway) + len(from_planted) == len(logs)  # nothing else wrote a failure log
    assert all(meta["source"] == "gateway" and kind in ("feedback", "json") for kind, meta in from_gateway)
    assert sum(kind == "feedback" for kind, _ in from_gateway) == first.failures + second.failures
    assert from_planted and len(from_planted) < len(first.lines)  # the broken lines are quarantined
    con.close()

    rates = [measured_rates(settings, version, serve) for serve in ("1", "2")]
    for measured, traffic in zip(rates, (first, second)):
        assert measured["requests"] == 30
        # a failure is a user's "bad" or a signal of the gateway's own (a cut JSON object)
        assert measured["failure_rate"] * 30 >= traffic.failures
        low, high = measured["interval"]
        assert low <= measured["failure_rate"] <= high
        assert sum(d["requests"] for d in measured["by_domain"].values()) == 30
        assert set(measured["by_domain"]) <= {"math", "code", "json"} and "math" in measured["by_domain"]
    scheduler = local_client().cluster.scheduler  # the warm cluster the code answers went to
    assert any(str(key).startswith("verify-") for key, *_ in scheduler.transition_log)
