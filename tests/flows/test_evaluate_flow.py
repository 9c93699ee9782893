"""The on-demand `evaluate` flow against a real Prefect server, on tiny models.

Two untrained tiny models (production and a candidate trained "from" it) and one
evaluation set: the flow scores both, leaves `models` alone unless asked, publishes
its artifacts, resumes a finished evaluation, and applies the gate when asked.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from storage.lake import append_rows, open_lake, transaction
from storage.settings import LakeSettings

pytestmark = pytest.mark.slow
ITEMS, SAMPLES = 6, 2


@pytest.fixture(scope="module")
def eval_home(tmp_path_factory):
    """A lake with a production model, a newer candidate of it, and one evaluation set."""
    from tasks.curate.evalsets import register_evalset
    from tasks.release.models import folder_version, register_model
    from tasks.round.train import model_row
    from flows.demo.tiny_model import ModelConfig, init_model

    home = tmp_path_factory.mktemp("evaluate") / "home"
    settings = LakeSettings(home=home)
    production = init_model(home / "prod", ModelConfig(seed=0))
    candidate = init_model(home / "cand", ModelConfig(seed=1))
    evalset = home / "arith.jsonl"
    evalset.write_text("".join(json.dumps({"id": f"e{i}", "domain": "math", "prompt": f"What is {i}+{i + 3}?",
                                           "reference": {"answer": str(2 * i + 3)}}) + "\n" for i in range(ITEMS)))
    con = open_lake(settings)
    register_evalset(con, "arith", evalset)
    prod = register_model(con, settings, production, "test: tiny model")
    cand = folder_version(candidate)
    with transaction(con, "test: a candidate"):
        append_rows(con, "models", model_row(cand, prod, str(candidate), "c0"))
    con.close()
    return {"home": home, "production": prod, "candidate": cand}


@pytest.fixture
def run_in(eval_home, prefect_server, monkeypatch, tmp_path):
    """Runs flows in this process against the session's Prefect server, with the tiny engine."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    monkeypatch.setenv("FLYWHEEL_HOME", str(eval_home["home"]))
    config = tmp_path / "flywheel.toml"
    config.write_text(f'[cycle.evaluate]\nk = 2\n[cycle.evaluate.engine]\nbackend = "transformers"\nn = {SAMPLES}\n'
                      'max_tokens = 6\ntemperature = 1.0\n')
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(config))
    with temporary_settings({PREFECT_API_URL: prefect_server.api_url}):
        yield
        # ship the runs' logs and events now: at exit they would be retried against a stopped server
        APILogWorker.drain_all()
        EventsWorker.drain_all()


def _lake(home):
    return open_lake(LakeSettings(home=home), read_only=True)


def _statuses(home) -> dict[str, str]:
    con = _lake(home)
    try:
        return dict(con.execute("SELECT policy_version, status FROM lake.models").fetchall())
    finally:
        con.close()


def _evaluation_rows(home, evaluation_id) -> dict[str, int]:
    con = _lake(home)
    try:
        return dict(con.execute("SELECT policy_version, count(*) FROM lake.evaluations WHERE cycle_id = ? "
                                "GROUP BY 1", [evaluation_id]).fetchall())
    finally:
        con.close()


def _artifact_keys(flow_run_id) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read():
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
            return {a.key for a in found}
    return asyncio.run(read())


def test_scores_the_newest_candidate_against_production_and_changes_nothing(eval_home, run_in):
    from flows.evaluate import EvaluateParams, evaluate_flow

    before = _statuses(eval_home["home"])
    state = evaluate_flow(EvaluateParams(evaluation_id="e1", eval_samples=SAMPLES), return_state=True)
    result = state.result()
    assert (result["candidate"], result["production"]) == (eval_home["candidate"], eval_home["production"])
    assert result["decision"]["items"] == ITEMS and result["applied"] is None
    assert result["decision"]["promoted"] == result["decision"]["reason"].startswith("promoted")
    assert _evaluation_rows(eval_home["home"], "e1") == {eval_home["candidate"]: ITEMS * SAMPLES,
                                                         eval_home["production"]: ITEMS * SAMPLES}
    assert _statuses(eval_home["home"]) == before
    assert {"flywheel-evaluation", "flywheel-gate"} <= _artifact_keys(state.state_details.flow_run_id)

    again = evaluate_flow(EvaluateParams(evaluation_id="e1", eval_samples=SAMPLES))
    assert again["decision"] == result["decision"]  # the recorded result, not a new sample
    assert _evaluation_rows(eval_home["home"], "e1") == {eval_home["candidate"]: ITEMS * SAMPLES,
                                                         eval_home["production"]: ITEMS * SAMPLES}


def test_production_by_name_is_scored_alone_and_an_unknown_model_refused(eval_home, run_in):
    """The baseline a model gets before any cycle: production on every set, no gate."""
    from typer.testing import CliRunner

    from flows.cli.app import app
    from flows.evaluate import EvaluateParams, evaluate_flow
    from tasks.release.models import ModelNotFound

    before = _statuses(eval_home["home"])
    result = evaluate_flow(EvaluateParams(policy_version=eval_home["production"][:12], evaluation_id="e-base",
                                          eval_samples=SAMPLES))
    assert result["candidate"] == result["production"] == eval_home["production"]
    assert result["decision"] is None and result["production_scores"]["items"] == ITEMS
    assert _evaluation_rows(eval_home["home"], "e-base") == {eval_home["production"]: ITEMS * SAMPLES}
    assert _statuses(eval_home["home"]) == before
    shown = CliRunner().invoke(app, ["evaluate", eval_home["production"], "--id", "e-base"])  # the recorded run
    said = " ".join(shown.output.split())
    assert shown.exit_code == 0 and f"production {eval_home['production']} alone (a baseline)" in said, shown.output
    assert said.count("│ production │") == 2 and "candidate" not in said.replace("candidate model", "")
    assert "gate: no comparison (production alone); models is unchanged" in said
    with pytest.raises(ModelNotFound, match="no model 'nope'"):
        evaluate_flow(EvaluateParams(policy_version="nope"))


def test_the_cli_prints_both_models_per_evaluation_set_and_the_gate(eval_home, run_in):
    from typer.testing import CliRunner

    from flows.cli.app import app
    from tasks.curate.evalsets import register_evalset

    long = eval_home["home"] / "long.jsonl"  # past the tiny model's 512-token context: not sampled, and said so
    long.write_text(json.dumps({"id": "l1", "domain": "math", "prompt": "What is 1+1? " * 400,
                                "reference": {"answer": "2"}}) + "\n")
    con = open_lake(LakeSettings(home=eval_home["home"]))
    register_evalset(con, "long", long)
    con.close()
    result = CliRunner().invoke(app, ["evaluate", eval_home["candidate"], "--samples", str(SAMPLES), "--id", "e3"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert f"candidate {eval_home['candidate']} against production {eval_home['production']}" in result.output
    for model in ("candidate", "production"):
        assert said.count(f"│ {model} │") == 2 and "arith" in said  # one row per set and one for all
    assert "gate: " in said and "not applied (--apply-gate is off)" in said
    assert "candidate: items not sampled: 1 too long" in said and "production: items not sampled: 1 too long" in said
    assert _evaluation_rows(eval_home["home"], "e3") == {eval_home["candidate"]: ITEMS * SAMPLES,
                                                         eval_home["production"]: ITEMS * SAMPLES}


def test_apply_gate_records_the_decision_on_the_model(eval_home, run_in):
    from flows.evaluate import EvaluateParams, evaluate_flow

    result = evaluate_flow(EvaluateParams(policy_version=eval_home["candidate"], evaluation_id="e2",
                                          eval_samples=SAMPLES, apply_gate=True))
    promoted = result["decision"]["promoted"]
    assert result["applied"]["promoted"] == promoted
    con = _lake(eval_home["home"])
    try:
        status, reason = con.execute("SELECT status, reason FROM lake.models WHERE policy_version = ?",
                                     [eval_home["candidate"]]).fetchone()
    finally:
        con.close()
    assert status == ("production" if promoted else "rejected")
    assert reason.startswith("gate in cycle e2: ")
