"""The whole cycle under a Prefect test server, on a tiny configuration.

A tiny model (briefly SFT-warmed on additions), one evaluation set, and a landing
file of failure logs with a leak and a broken line go through every stage; every
table fills, artifacts appear, a rerun resumes instead of redoing, and a cycle
killed mid-stage completes on rerun without duplicate rows. Overlapped rounds: round 1
samples (and commits) while round 0 trains, max_staleness 0 is the synchronous loop,
and a trainer killed meanwhile publishes nothing.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from storage.lake import open_lake
from storage.settings import LakeSettings

pytestmark = pytest.mark.slow

TABLES = ("ingest_batches", "failure_logs", "quarantine", "eval_items", "tasks", "decisions", "rollouts",
          "verdicts", "train_steps", "models", "evaluations", "cycles", "cycle_stages", "minhash_signatures")

# The cycle's configuration for tests, as an operator writes it in flywheel.toml: small
# and quick. The transformers engine stands in for vLLM's process start-up (vLLM itself
# is covered by tests/trainer/test_engine.py).
SMALL_CONFIG = textwrap.dedent("""
    [cycle.rollout]
    tasks_per_round = 64
    [cycle.rollout.engine]
    backend = "transformers"
    n = 8
    max_tokens = 6
    temperature = 1.0
    [cycle.train.grpo]
    steps = 2
    groups_per_step = 4
    max_tokens = 6
    checkpoint_every = 1
    [cycle.evaluate]
    k = 2
    [cycle.evaluate.engine]
    backend = "transformers"
    n = 2
    max_tokens = 6
    temperature = 1.0
""")


def _log(i: int, a: int, b: int) -> dict:
    return {"id": f"req-{i}", "ts": "2026-11-30T12:00:00Z", "model": "policy-v0", "domain": "math",
            "messages": [{"role": "user", "content": f"What is {a}+{b}?"}], "response": str(a + b + 1),
            "failure": {"kind": "wrong_answer"}, "reference": {"answer": str(a + b)}}


def warm_policy(folder: Path) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """SFT-warm a policy into folder/sft-model that is right sometimes; return (trained, held-out) sums.

    The cheapest recipe that gives groups with reward variance: a 2-layer tiny Llama and 60
    flat-rate steps (the default 4 layers with warm-up need hundreds of steps to get there).
    """
    from flows.demo.tiny_model import ModelConfig, init_model
    from flows.demo.sft import SFTConfig, run_sft

    rng = random.Random(5)
    pairs = sorted({(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(400)})
    train, held = pairs[:360], pairs[360:380]
    sft = folder / "sft.jsonl"
    sft.write_text("".join(json.dumps({"prompt": f"What is {a}+{b}?", "completion": str(a + b)}) + "\n"
                           for a, b in train))
    run_sft(init_model(folder / "init", ModelConfig(num_hidden_layers=2)), sft, folder / "sft-model",
            SFTConfig(steps=60, batch_size=64, warmup_steps=0, min_lr_ratio=1.0))
    return train, held


@pytest.fixture(scope="module")
def cycle_home(tmp_path_factory):
    """A lake with a production model, an eval set and one landing file."""
    from tasks.curate.evalsets import register_evalset
    from tasks.release.models import register_model

    home = tmp_path_factory.mktemp("cycle") / "home"
    settings = LakeSettings(home=home)
    home.mkdir(parents=True)
    train, held = warm_policy(home)
    evalset = home / "arith.jsonl"
    evalset.write_text("".join(json.dumps({"id": f"e{i}", "domain": "math", "prompt": f"What is {a}+{b}?",
                                           "reference": {"answer": str(a + b)}}) + "\n" for i, (a, b) in enumerate(held)))
    landing = home / "landing"
    landing.mkdir()
    logs = [_log(i, a, b) for i, (a, b) in enumerate(train[:40])]
    leak = {**_log(99, *held[0]), "messages": [{"role": "user", "content": f"WHAT   IS {held[0][0]}+{held[0][1]}?"}]}
    (home / "flywheel.toml").write_text(SMALL_CONFIG)  # FLYWHEEL_CONFIG names it in the tests
    (landing / "traffic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logs + [leak]) + "{broken\n")
    con = open_lake(settings)
    register_evalset(con, "arith", evalset)
    register_model(con, settings, home / "sft-model", "test: tiny SFT model")
    con.close()
    return home


def _counts(home) -> dict[str, int]:
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM lake.{t}").fetchone()[0] for t in TABLES}
    finally:
        con.close()


def test_a_cycle_fills_every_table_and_publishes_artifacts(cycle_home, monkeypatch):
    from prefect.testing.utilities import prefect_test_harness

    monkeypatch.setenv("FLYWHEEL_HOME", str(cycle_home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(cycle_home / "flywheel.toml"))
    from flows.flywheel import CycleParams, flywheel_cycle

    with prefect_test_harness(server_startup_timeout=120):
        summary = flywheel_cycle(CycleParams(cycle_id="t1", rounds=1))
        from prefect.client.orchestration import get_client

        async def keys():
            async with get_client() as client:
                return {a.key for a in await client.read_artifacts()}
        import asyncio

        artifact_keys = asyncio.run(keys())
        assert summary["status"] == "completed"
        counts = _counts(cycle_home)
        assert all(counts[t] > 0 for t in TABLES), counts
        assert {"flywheel-funnel", "flywheel-evaluation"} <= artifact_keys
        con = open_lake(LakeSettings(home=cycle_home), read_only=True)
        decisions = dict(con.execute("SELECT decision, count(*) FROM lake.decisions GROUP BY 1").fetchall())
        assert decisions.get("contaminated") == 1 and decisions.get("kept") == 40
        assert con.execute("SELECT status, snapshot_id IS NOT NULL FROM lake.cycles WHERE cycle_id = 't1'"
                           ).fetchone() == ("completed", True)
        con.close()
        # the same cycle again resumes: every stage is skipped, nothing is written twice
        again = flywheel_cycle(CycleParams(cycle_id="t1", rounds=1))
        assert again["status"] == "completed"
        after = _counts(cycle_home)
        assert {t: after[t] for t in TABLES if t != "cycles"} == {t: counts[t] for t in TABLES if t != "cycles"}
        assert (cycle_home / "reports" / "t1" / "summary.md").exists()
        assert again["report"] == str(cycle_home / "reports" / "t1")
        # `flywheel cycle` prints the report, the time per stage and where the report is
        from typer.testing import CliRunner

        from flows.cli.app import app

        shown = CliRunner().invoke(app, ["cycle", "--cycle-id", "t1"])
        said = " ".join(shown.output.split())
        assert shown.exit_code == 0, shown.output
        assert "flywheel cycle t1" in said and "Funnel" in said and ("PROMOTED" in said or "REJECTED" in said)
        assert "cycle t1 completed in " in said and "curate " in said and "report: " in said


_RUN_CYCLE = textwrap.dedent("""
    import sys
    from flows.flywheel import CycleParams, flywheel_cycle
    print(flywheel_cycle(CycleParams(cycle_id=sys.argv[1], rounds=1)))
""")


def test_a_cycle_killed_mid_stage_completes_on_rerun_without_duplicates(cycle_home):
    env = {**os.environ, "FLYWHEEL_HOME": str(cycle_home), "FLYWHEEL_CONFIG": str(cycle_home / "flywheel.toml")}
    proc = subprocess.Popen([sys.executable, "-c", _RUN_CYCLE, "t2"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    stages: list = []
    while "verify" not in stages:  # kill while training (rollouts and verdicts committed)
        assert proc.poll() is None, "the cycle ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.5)
        con = open_lake(LakeSettings(home=cycle_home), read_only=True)
        stages = [r[0] for r in con.execute("SELECT stage FROM lake.cycle_stages WHERE cycle_id = 't2'").fetchall()]
        con.close()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    rerun = subprocess.run([sys.executable, "-c", _RUN_CYCLE, "t2"], env=env, capture_output=True, text=True,
                           timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    con = open_lake(LakeSettings(home=cycle_home), read_only=True)
    for table, key in (("rollouts", "rollout_id"), ("verdicts", "rollout_id"), ("tasks", "task_id"),
                       ("decisions", "log_id"), ("evaluations", "policy_version, item_id, sample_idx, cycle_id")):
        total, distinct = con.execute(f"SELECT count(*), count(DISTINCT ({key})) FROM lake.{table}").fetchone()
        assert total == distinct, table
    assert con.execute("SELECT status FROM lake.cycles WHERE cycle_id = 't2'").fetchone()[0] == "completed"
    stage_rows = con.execute("SELECT stage, count(*) FROM lake.cycle_stages WHERE cycle_id = 't2' GROUP BY 1").fetchall()
    assert all(n == 1 for _, n in stage_rows)


def _round_spans(home, cycle_id: str) -> dict[tuple[str, int], tuple[float, float]]:
    """(stage, round) -> (start, end) in seconds since the epoch, from `cycle_stages`."""
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        rows = con.execute("SELECT stage, round, seconds, epoch(finished_at) FROM lake.cycle_stages "
                           "WHERE cycle_id = ?", [cycle_id]).fetchall()
    finally:
        con.close()
    return {(stage, r): (end - seconds, end) for stage, r, seconds, end in rows}


def _lineage(home, cycle_id: str) -> tuple[list[tuple], dict[int, set[str]]]:
    """The cycle's trained models (version, parent, reason) by creation, and the
    policies that sampled each round."""
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        models = con.execute("SELECT policy_version, parent_version, reason FROM lake.models "
                             "WHERE cycle_id = ? ORDER BY created_at", [cycle_id]).fetchall()
        sampled: dict[int, set[str]] = {}
        for r, version in con.execute("SELECT DISTINCT round, policy_version FROM lake.rollouts "
                                      "WHERE cycle_id = ?", [cycle_id]).fetchall():
            sampled.setdefault(r, set()).add(version)
        return models, sampled
    finally:
        con.close()


def _train_counts(home, cycle_id: str, round_: int) -> dict:
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        return json.loads(con.execute("SELECT counts FROM lake.cycle_stages WHERE cycle_id = ? AND stage = 'train' "
                                      "AND round = ?", [cycle_id, round_]).fetchone()[0])
    finally:
        con.close()


def test_round_two_samples_while_round_one_trains_and_staleness_zero_is_the_synchronous_loop(cycle_home,
                                                                                              monkeypatch):
    from prefect.testing.utilities import prefect_test_harness

    monkeypatch.setenv("FLYWHEEL_HOME", str(cycle_home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(cycle_home / "flywheel.toml"))
    from flows.flywheel import CycleParams, flywheel_cycle

    monkeypatch.setenv("FLYWHEEL_CYCLE_TRAIN_GRPO_STEPS", "6")  # a job longer than a round's sampling
    with prefect_test_harness(server_startup_timeout=120):
        for cycle_id, staleness in (("over", 1), ("sync", 0)):
            summary = flywheel_cycle(CycleParams(cycle_id=cycle_id, rounds=2, max_staleness=staleness))
            assert summary["status"] == "completed", summary
    # k = 1: round 1 is sampled by the policy round 0 trained from, while round 0 trains
    (m0, production, _), (m1, parent, _) = _lineage(cycle_home, "over")[0]
    assert _lineage(cycle_home, "over")[1] == {0: {production}, 1: {production}}
    assert parent == m0 and _train_counts(cycle_home, "over", 1)["sampled_by"] == production
    spans = _round_spans(cycle_home, "over")
    (train_start, train_end), (_, roll_end) = spans[("train", 0)], spans[("rollout", 1)]
    # and committed while it trained: the two stages' lake connections met (storage/lake_turn.py)
    assert train_start < roll_end < train_end, spans
    # k = 0: each round is sampled by the policy it trains, after the round before has trained
    (s0, production, _), (s1, parent, _) = _lineage(cycle_home, "sync")[0]
    assert _lineage(cycle_home, "sync")[1] == {0: {production}, 1: {s0}}
    assert parent == s0 and _train_counts(cycle_home, "sync", 1)["sampled_by"] == s0
    spans = _round_spans(cycle_home, "sync")
    order = sorted(spans, key=lambda k: spans[k][0])
    rounds = [k for k in order if k[0] in ("rollout", "verify", "train")]
    assert rounds == [(s, r) for r in (0, 1) for s in ("rollout", "verify", "train")]
    assert all(spans[a][1] <= spans[b][0] for a, b in zip(rounds, rounds[1:])), spans
    # each round's job goes on from the AdamW state of the job that trained its parent;
    # the first round's parent was registered, not trained here: fresh moments
    jobs = cycle_home / "jobs"
    for first, second in ((m0, m1), (s0, s1)):
        assert "fresh AdamW state" in (jobs / first / "train.log").read_text()
        assert json.loads((jobs / second / "job.json").read_text())["optimizer_from"] == str(jobs / first)
        assert "AdamW state carried from" in (jobs / second / "train.log").read_text()


_RUN_OVERLAPPED = textwrap.dedent("""
    import sys
    from flows.flywheel import CycleParams, flywheel_cycle
    print(flywheel_cycle(CycleParams(cycle_id=sys.argv[1], rounds=2, max_staleness=1)))
""")


def _trainer_pids(home: Path) -> list[tuple[int, Path]]:
    """(pid, job folder) of every running DeepSpeed trainer of this lake."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            # a cold job's arguments, or the one title a forked job gives itself
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").split()
        except OSError:
            continue
        if b"trainer.ds_train" in args and b"--job" in args:
            job = Path(args[args.index(b"--job") + 1].decode())
            if str(job).startswith(str(home)):
                found.append((int(proc.name), job))
    return found


def test_a_trainer_killed_while_the_next_round_samples_publishes_nothing_and_the_rerun_completes(cycle_home):
    from trainer.job import checkpoint_dir, model_dir

    # six steps, a checkpoint after each: the kill lands between two of them
    env = {**os.environ, "FLYWHEEL_HOME": str(cycle_home), "FLYWHEEL_CONFIG": str(cycle_home / "flywheel.toml"),
           "FLYWHEEL_CYCLE_TRAIN_GRPO_STEPS": "6"}
    proc = subprocess.Popen([sys.executable, "-c", _RUN_OVERLAPPED, "kill"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, killed = time.monotonic() + 600, None
    while killed is None:
        assert proc.poll() is None, "the cycle ended before its trainer could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.2)
        for pid, job in _trainer_pids(cycle_home):
            if (checkpoint_dir(job) / "latest").exists():
                os.kill(pid, signal.SIGKILL)
                killed = job
    assert proc.wait(timeout=600) != 0
    con = open_lake(LakeSettings(home=cycle_home), read_only=True)
    assert con.execute("SELECT status FROM lake.cycles WHERE cycle_id = 'kill'").fetchone()[0] == "failed"
    assert con.execute("SELECT count(*) FROM lake.models WHERE cycle_id = 'kill'").fetchone()[0] == 0
    con.close()
    assert not model_dir(killed).exists()
    rerun = subprocess.run([sys.executable, "-c", _RUN_OVERLAPPED, "kill"], env=env, capture_output=True, text=True,
                           timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (m0, _, _), (m1, parent, _) = _lineage(cycle_home, "kill")[0]
    assert parent == m0 and model_dir(killed).is_dir()  # the killed job resumed and finished
    con = open_lake(LakeSettings(home=cycle_home), read_only=True)
    stage_rows = con.execute("SELECT stage, round, count(*) FROM lake.cycle_stages WHERE cycle_id = 'kill' "
                             "GROUP BY 1, 2").fetchall()
    con.close()
    assert all(n == 1 for _, _, n in stage_rows)
