"""MLflow tracking from a real lake: what a cycle's, a job's and an evaluation's runs hold,
reruns, a tracker that is down, the compose server run natively, and what tracking costs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
import yaml

from storage.lake import append_rows, open_lake, transaction
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.release import decisions
from tasks.release.gate import GateConfig
from tasks.reports.tracking import track_cycle, track_evaluation, tracking_uri
from tasks.stages import StageKey
from tests import services
from trainer.grpo import GRPOConfig

ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
# The smallest real model's training job as measured (docs/architecture.md: SmolLM2-135M,
# 2 steps, 208 s on 2 CPU ranks): what the lake records for a real train stage.
STEP_SECONDS = 104.0
STEPS = GRPOConfig().steps  # a job's default optimiser steps (8)


def _evals(policy, cycle, passes):
    """passes: item -> list of booleans, one per sample."""
    return [{"policy_version": policy, "eval_set": "arith", "item_id": item, "domain": "math", "sample_idx": s,
             "reward": float(p), "passed": p, "status": "ok" if p else "wrong", "completion_tokens": 5,
             "finish_reason": "stop", "cycle_id": cycle}
            for item, samples in passes.items() for s, p in enumerate(samples)]


def _steps(version, n, kl_reference):
    # the first step has no supervised part: its sft columns are NULL
    return [{"policy_version": version, "step": s, "loss": 0.5 - 0.1 * s, "reward_mean": 0.2 + 0.1 * s,
             "reward_std": 0.3, "kl": 0.01 * s, "entropy": 2.0, "clip_frac": 0.1, "resp_len_mean": 6.0,
             "groups_kept": 4, "groups_dropped": 1, "tokens_per_s": 900.0, "cycle_id": "c2",
             "kl_reference": kl_reference, "sft_loss": None if s == 1 else 1.5, "sft_tokens": None if s == 1 else 40}
            for s in range(1, n + 1)]


def _stage(stage, round_, seconds, cycle="c2", **counts):
    return {"stage": stage, "round": round_, "seconds": seconds, "counts": json.dumps(counts),
            "finished_at": T0, "cycle_id": cycle}


PASSES_V3 = {"i1": [True, True], "i2": [True, False], "i3": [False, False]}
PASSES_V1 = {"i1": [True, False], "i2": [False, False], "i3": [False, False]}
ROWS = {
    "models": [
        {"policy_version": "v1", "status": "production", "reason": "seed", "uri": "/m/v1", "created_at": T0,
         "cycle_id": "c1", "source": "smollm2"},
        {"policy_version": "v2", "parent_version": "v1", "status": "candidate", "reason": "trained", "uri": "/m/v2",
         "created_at": T0 + timedelta(hours=1), "cycle_id": "c2"},
        {"policy_version": "v3", "parent_version": "v2", "status": "rejected", "reason": "gate says no",
         "uri": "/m/v3", "created_at": T0 + timedelta(hours=2), "cycle_id": "c2"}],
    # two rounds, as `flywheel demo` runs them: round 0 trains v2 from v1 without a
    # reference model, round 1 v3 from v2 with one
    "train_steps": _steps("v2", STEPS, False) + _steps("v3", STEPS, True),
    "routes": [{"task_id": f"t{i}", "round": r, "policy_version": "v1", "domain": "math", "samples": 8,
                "passes": 4, "route": route, "cycle_id": "c2"}
               for i, (r, route) in enumerate([(0, "rl"), (0, "rl"), (0, "sft"), (0, "skip"),
                                               (1, "rl"), (1, "retire")])],
    "cycle_stages": [_stage("rollout", 0, 50.0), _stage("train", 0, STEPS * STEP_SECONDS, policy_version="v2"),
                     _stage("rollout", 1, 40.0), _stage("train", 1, STEPS * STEP_SECONDS, policy_version="v3"),
                     _stage("evaluate", None, 30.0)],
    "evaluations": _evals("v3", "c2", PASSES_V3) + _evals("v1", "c2", PASSES_V1)
    + _evals("v3", "eval-1", PASSES_V3) + _evals("v1", "eval-1", PASSES_V1),
    "cycles": [{"cycle_id": "c2", "started_at": T0, "status": "completed", "snapshot_id": 7}],
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One lake for the module (opening a lake costs seconds), with cycle c2 and evaluation
    eval-1 gated as the gate stage does; the MLflow store beside it is shared too."""
    home = tmp_path_factory.mktemp("tracking") / "home"
    con = open_lake(LakeSettings(home=home))
    with transaction(con):
        for table, rows in ROWS.items():
            append_rows(con, table, pa.Table.from_pylist(rows, schema=SCHEMAS[table]))
    for gated in ("c2", "eval-1"):
        decisions.run(con, GateConfig(), StageKey(gated, policy="v3", production="v1"))
    con.close()
    report = home / "reports" / "c2"
    report.mkdir(parents=True)
    (report / "summary.md").write_text("# cycle c2\n")
    return home


@pytest.fixture(autouse=True)
def lake_env(home, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(home / "absent.toml"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _client(uri):
    from mlflow import MlflowClient
    return MlflowClient(tracking_uri=uri)


def _runs(client, kind, cycle_id):
    experiment = client.get_experiment_by_name("flywheel")
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`flywheel.kind` = '{kind}' "
                              f"and tags.`flywheel.cycle_id` = '{cycle_id}'")


def _children(client, run):
    return client.search_runs([run.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")


def test_a_cycle_is_a_run_with_its_config_gate_routes_and_lineage(home):
    outcome = track_cycle("c2", {"rollout.tasks_per_round": 8}, home / "reports" / "c2")

    assert outcome["tracked"] and outcome["written"], outcome
    assert outcome["uri"] == tracking_uri(home) == f"sqlite:///{home.resolve()}/mlflow/mlflow.db"
    assert (home / "mlflow" / "mlflow.db").exists()  # the embedded store: nothing to start
    client = _client(outcome["uri"])
    (run,) = _runs(client, "cycle", "c2")
    assert run.info.run_id == outcome["run_id"] and run.info.status == "FINISHED"
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    assert tags["flywheel.status"] == "completed" and tags["flywheel.gate"] == "rejected"
    assert tags["flywheel.candidate"] == "v3" and tags["flywheel.production"] == "v1"
    assert tags["flywheel.gate.reason"].startswith("rejected")
    # the config the cycle ran with, the run's own overrides included
    assert params["rollout.tasks_per_round"] == "8" and params["train.grpo.lr"] == "3e-05"
    assert params["rollout.engine.backend"] == "vllm"
    assert metrics["pass_at_1/candidate/arith"] == pytest.approx(0.5)
    assert metrics["pass_at_1/production/all"] == pytest.approx(1 / 6, abs=1e-4)  # the report rounds
    assert metrics["gate/promoted"] == 0.0 and metrics["gate/items"] == 3
    assert metrics["funnel/groups trained"] == 8.0  # each job's 4 kept groups, counted once
    routes = {(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "routes/rl")}
    assert routes == {(0, 2.0), (1, 1.0)}
    assert [m.step for m in client.get_metric_history(run.info.run_id, "stage_seconds/train")] == [0, 1]
    assert metrics["tracking/share_of_training"] == pytest.approx(
        metrics["tracking/seconds"] / (2 * STEPS * STEP_SECONDS))

    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"gate.json", "lineage.json", "report"} <= files
    assert [f.path for f in client.list_artifacts(run.info.run_id, "report")] == ["report/summary.md"]
    lineage = json.loads(Path(client.download_artifacts(run.info.run_id, "lineage.json")).read_text())
    assert [(m["policy_version"], m["parent_version"], m["uri"]) for m in lineage] == [
        ("v3", "v2", "/m/v3"), ("v2", "v1", "/m/v2"), ("v1", None, "/m/v1")]
    gate = json.loads(Path(client.download_artifacts(run.info.run_id, "gate.json")).read_text())
    assert gate["items"] == 3 and gate["promoted"] is False


def test_each_training_job_is_a_child_run_with_every_step(home):
    client = _client(track_cycle("c2")["uri"])  # a rerun: the runs of the first test are kept
    (run,) = _runs(client, "cycle", "c2")
    jobs = {child.data.tags["flywheel.policy_version"]: child for child in _children(client, run)}
    assert set(jobs) == {"v2", "v3"}
    for version, steps in (("v2", STEPS), ("v3", STEPS)):
        job = jobs[version]
        history = client.get_metric_history(job.info.run_id, "reward_mean")
        assert [m.step for m in history] == list(range(1, steps + 1))  # one point per train_steps row
        assert [m.value for m in history] == pytest.approx([0.2 + 0.1 * s for s in range(1, steps + 1)])
        for column in ("loss", "kl", "entropy", "clip_frac", "resp_len_mean", "groups_kept", "groups_dropped",
                       "tokens_per_s", "reward_std"):
            assert len(client.get_metric_history(job.info.run_id, column)) == steps, (version, column)
        # NULL is no point: the first step had no supervised part
        assert [m.step for m in client.get_metric_history(job.info.run_id, "sft_loss")] == list(range(2, steps + 1))
    assert jobs["v2"].data.tags["flywheel.kl_to"] == "rollout policy"
    assert jobs["v3"].data.tags["flywheel.kl_to"] == "reference"
    assert jobs["v3"].data.tags["flywheel.parent_version"] == "v2"
    assert jobs["v3"].data.tags["flywheel.model_uri"] == "/m/v3"
    assert jobs["v3"].data.tags["flywheel.model_status"] == "rejected"
    assert jobs["v3"].data.tags["flywheel.round"] == "1"
    assert jobs["v2"].data.params["train.grpo.kl_coef"] == "0.0"
    assert jobs["v2"].data.metrics["train_stage_seconds"] == STEPS * STEP_SECONDS


def test_tracking_again_writes_nothing_and_a_half_written_run_is_written_again(home):
    first = track_cycle("c2")
    again = track_cycle("c2")
    assert not again["written"] and again["run_id"] == first["run_id"]
    client = _client(first["uri"])
    (run,) = _runs(client, "cycle", "c2")
    assert len(_children(client, run)) == 2
    assert len(client.get_metric_history(run.info.run_id, "routes/rl")) == 2

    # tracking that died after creating the run (never marked finished) is redone whole
    experiment = client.get_experiment_by_name("flywheel").experiment_id
    stale = client.create_run(experiment, tags={"flywheel.kind": "cycle", "flywheel.cycle_id": "c-none"})
    redone = track_cycle("c-none")
    assert redone["written"] and redone["run_id"] != stale.info.run_id
    assert client.get_run(stale.info.run_id).info.lifecycle_stage == "deleted"
    (run,) = _runs(client, "cycle", "c-none")
    assert run.info.status == "FINISHED" and run.data.tags["flywheel.gate"] == "no decision"


def test_an_evaluation_is_a_run(home):
    outcome = track_evaluation("eval-1", {"candidate": "v3", "production": "v1"}, None, {"evaluate.k": 2})
    assert outcome["tracked"], outcome
    client = _client(outcome["uri"])
    (run,) = _runs(client, "evaluation", "eval-1")
    assert run.data.tags["flywheel.gate"] == "rejected" and run.data.tags["flywheel.applied"] == "false"
    assert run.data.params["evaluate.k"] == "2" and "gate.confidence" in run.data.params
    assert "train.grpo.lr" not in run.data.params
    assert run.data.metrics["pass_at_1/candidate/arith"] == pytest.approx(0.5)
    assert {f.path for f in client.list_artifacts(run.info.run_id)} == {"gate.json", "lineage.json"}


def test_a_tracker_that_is_down_costs_a_warning_not_the_report(home, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{services.free_port()}")
    started = time.perf_counter()
    with caplog.at_level("WARNING", logger="tasks.reports.tracking"):
        outcome = track_cycle("c2")
    assert not outcome["tracked"] and "no MLflow tracking server answers" in outcome["error"]
    assert time.perf_counter() - started < 10  # one probe, not MLflow's minutes of retries
    assert "MLflow tracking of cycle c2" in caplog.text and "unaffected" in caplog.text


def test_the_report_task_finishes_when_the_tracker_is_down(home, monkeypatch):
    from prefect import flow
    from prefect.testing.utilities import prefect_test_harness

    from tasks.cycle.prefect_tasks import report_task

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{services.free_port()}")

    @flow
    def report():
        return report_task("c2")

    with prefect_test_harness(server_startup_timeout=90):
        result = report()
    assert result["tracking"]["tracked"] is False and "no MLflow" in result["tracking"]["error"]
    assert (Path(result["folder"]) / "training.png").exists()


def test_tracking_costs_under_one_percent_of_the_training_it_tracks(home):
    """Tracking measures itself: the seconds from the report task's call to the run marked
    finished (importing MLflow, opening and reading the lake, MLflow's store, every call),
    against the train stage's seconds the lake records (here the real job figure above).
    Measured as the report task runs it, in a process that has not imported MLflow, on a
    store that exists, as for every cycle after a home's first (creating it costs ~5 s once)."""
    track_cycle("c-none")  # the store and its tables exist
    client = _client(tracking_uri(home))
    for run in _runs(client, "cycle", "c2"):  # so that c2 is written, not found
        client.delete_run(run.info.run_id)
    code = "import json; from tasks.reports.tracking import track_cycle; print(json.dumps(track_cycle('c2')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    steps, train = 2 * STEPS, 2 * STEPS * STEP_SECONDS
    print(f"\ntracking a cycle of {steps} steps: {outcome['seconds']:.2f} s; its training {train:.0f} s "
          f"({STEP_SECONDS:.0f} s a step); tracking's share {outcome['share_of_training']:.3%}, "
          f"{outcome['seconds'] / steps:.2f} s per step tracked")
    assert done.returncode == 0 and outcome["written"], done.stderr[-2000:]
    assert outcome["share_of_training"] < 0.01


@pytest.mark.slow
def test_the_compose_mlflow_service_run_natively_tracks_a_cycle_over_http(home, tmp_path, monkeypatch):
    """docker-compose.yml's `mlflow` command as it is, its volume a temporary folder, its port
    a free one, its Host rule from .env.example. The server is ready in ~7-14 s on 2 idle
    cores (creating its SQLite tables is most of it; ~50 s seen on a loaded machine)."""
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["mlflow"]
    port = services.free_port()
    argv = [str(Path(sys.executable).parent / service["command"][0])]
    argv += [a.replace("/var/lib/mlflow", str(tmp_path)).replace("0.0.0.0", "127.0.0.1")
             for a in service["command"][1:]]
    argv[argv.index("--port") + 1] = str(port)
    allowed = [line.split("=", 1)[1] for line in (ROOT / ".env.example").read_text().splitlines()
               if line.startswith("MLFLOW_SERVER_ALLOWED_HOSTS=")][0]
    env = {**os.environ, **{k: str(v) for k, v in service["environment"].items()},
           "MLFLOW_SERVER_ALLOWED_HOSTS": allowed}
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=open(tmp_path / "mlflow.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc, tmp_path / "mlflow.log")
        print(f"\nmlflow server healthy after {time.perf_counter() - started:.1f} s")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        outcome = track_cycle("c2", None, home / "reports" / "c2")
        assert outcome["tracked"] and outcome["written"], outcome
        assert outcome["url"].startswith(f"{url}/#/experiments/")
        client = _client(url)
        (run,) = _runs(client, "cycle", "c2")
        assert len(_children(client, run)) == 2
        # artifacts went through the server into its volume
        assert list((tmp_path / "artifacts").rglob("gate.json"))
        # the services' Host header (mlflow:5000) is one the server answers
        answer = httpx.get(f"{url}/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": "flywheel"},
                           headers={"Host": "mlflow:5000"}, timeout=10)
        assert answer.status_code == 200, answer.text
        assert httpx.get(url, timeout=10).text.lstrip().lower().startswith("<!doctype html")  # the UI
    finally:
        services.stop(proc)


def _wait_healthy(url, proc, log, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"mlflow server not healthy after {timeout} s:\n{log.read_text()[-3000:]}")
