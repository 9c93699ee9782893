"""The cycle report from a real lake filled with small rows of every table."""
import csv
import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from storage.lake import append_rows, open_lake, transaction
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.release import decisions
from tasks.release.decisions import item_scores
from tasks.release.gate import GateConfig, decide
from tasks.reports.cycle_report import build_report, kl_title, pass_at_1_by_cycle, publish_report
from tasks.stages import StageKey

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _t(table, rows):
    return pa.Table.from_pylist(rows, schema=SCHEMAS[table])  # columns not given are NULL


def _evals(policy, cycle, outcomes):
    """outcomes: item -> list of True / False / "timeout", one per sample."""
    return [{"policy_version": policy, "eval_set": "arith", "item_id": item, "domain": "math", "sample_idx": s,
             "reward": float(o is True), "passed": o is True, "status": o if o == "timeout" else
             ("ok" if o else "wrong"), "completion_tokens": 5, "finish_reason": "stop", "cycle_id": cycle}
            for item, samples in outcomes.items() for s, o in enumerate(samples)]


ROWS = {
    "ingest_batches": [{"batch_id": "b2", "source_uri": "landing/x.jsonl", "rows_ok": 5, "rows_quarantined": 2,
                        "ingested_at": T0, "cycle_id": "c2"}],
    "failure_logs": [{"log_id": f"l{i}", "batch_id": "b2", "cycle_id": "c2"} for i in range(5)]
    + [{"log_id": f"old{i}", "batch_id": "b1", "cycle_id": "c1"} for i in range(2)],
    "quarantine": [{"batch_id": "b2", "line_no": n, "raw": "{", "kind": "json", "reason": "not JSON",
                    "cycle_id": "c2"} for n in (3, 7)],
    "eval_items": [{"eval_set": "arith", "eval_version": "e1", "item_id": f"i{i}", "domain": "math",
                    "prompt": f"q{i}", "cycle_id": "c1"} for i in range(1, 5)],
    "decisions": [{"log_id": f"l{i}", "decision": d, "evidence": "{}", "cycle_id": "c2"} for i, d in
                  enumerate(["kept", "kept", "duplicate", "near_duplicate", "contaminated"])],
    "tasks": [{"task_id": f"t{i}", "domain": "math", "prompt": f"p{i}", "cycle_id": "c2"} for i in range(2)],
    "rollouts": [{"rollout_id": f"r{i}", "task_id": f"t{i % 2}", "policy_version": "v1", "round": 0,
                  "sample_idx": i // 2, "cycle_id": "c2"} for i in range(8)],
    "verdicts": [{"rollout_id": f"r{i}", "verifier": "math", "reward": float(i % 3 == 0), "passed": i % 3 == 0,
                  "status": "ok" if i % 3 == 0 else "wrong", "cycle_id": "c2"} for i in range(8)],
    "train_steps": [{"policy_version": "v2", "step": s, "loss": 0.1, "reward_mean": 0.2 + 0.1 * s,
                     "reward_std": 0.3, "kl": 0.01 * s, "entropy": 2.0 - 0.1 * s, "resp_len_mean": 6.0,
                     # every step row of a job carries the job's kept-group count
                     "groups_kept": 5, "groups_dropped": 1, "cycle_id": "c2"} for s in (1, 2, 3)]
    + [{"policy_version": "v1", "step": 1, "groups_kept": 10, "cycle_id": "c1"}],
    "models": [{"policy_version": "v1", "parent_version": None, "status": "production", "reason": "seed",
                "created_at": T0, "cycle_id": "c1"},
               {"policy_version": "v2", "parent_version": "v1", "status": "rejected", "reason": "gate says no",
                "created_at": T0 + timedelta(hours=1), "cycle_id": "c2"}],
    "evaluations": _evals("v2", "c2", {"i1": [True, True], "i2": [True, False], "i3": [False, "timeout"],
                                       "i4": ["timeout", "timeout"]})
    + _evals("v1", "c2", {"i1": [True, False], "i2": [False, False], "i3": [False, False], "i4": [True, True]})
    + _evals("v1", "c1", {"i1": [True, True], "i2": [False, False], "i3": [False, False], "i4": [False, False]}),
    "cycles": [{"cycle_id": "c1", "started_at": T0, "status": "finished"},
               {"cycle_id": "c2", "started_at": T0 + timedelta(hours=2), "status": "running"}],
}


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """One lake for the module (the tests only read it): opening a lake costs seconds."""
    con = open_lake(LakeSettings(home=tmp_path_factory.mktemp("lake") / "home"))
    with transaction(con):
        for table, rows in ROWS.items():
            append_rows(con, table, _t(table, rows))
    yield con
    con.close()


def test_report_files_and_numbers(lake, tmp_path):
    v2 = [{"eval_set": "arith", "item_id": i, "domain": "math", "score": s} for i, s in
          (("i1", 1.0), ("i2", 0.5), ("i3", 0.0))]
    v1 = [{"eval_set": "arith", "item_id": i, "domain": "math", "score": s} for i, s in
          (("i1", 0.5), ("i2", 0.0), ("i3", 0.0), ("i4", 1.0))]
    gate = decide(v2, v1, GateConfig())
    # the gate stage reads the same per-item scores from `evaluations` and records the decision
    key = StageKey("c2", policy="v2", production="v1")
    assert sorted(item_scores(lake, "v2", "c2"), key=lambda r: r["item_id"]) == [
        {**r, "n": n, "c": c} for r, (n, c) in zip(v2, [(2, 2), (2, 1), (1, 0)])]
    assert decisions.run(lake, GateConfig(), key)["decision"] == gate.to_dict()
    assert decisions.recorded_decision(lake, "c2", "v2") == gate
    report = build_report(lake, "c2", tmp_path / "home")

    folder = tmp_path / "home" / "reports" / "c2"
    assert report.folder == folder
    for name in ("funnel.csv", "evaluation.csv", "training.png", "pass_at_1.png", "summary.md", "gate.json"):
        assert (folder / name).stat().st_size > 0, name
    assert (folder / "training.png").read_bytes()[:4] == b"\x89PNG"

    assert {r["stage"]: r["rows"] for r in report.funnel} == {
        "log lines": 7, "quarantined": 2, "duplicate": 1, "near duplicate": 1, "contaminated": 1,
        "unverifiable": 0, "kept": 2, "tasks": 2, "rollouts": 8, "verified": 8, "groups trained": 5}
    with (folder / "funnel.csv").open() as f:
        assert [int(r["rows"]) for r in csv.DictReader(f)] == [r["rows"] for r in report.funnel]

    table = {(r["policy_version"], r["eval_set"]): r for r in report.evaluation}
    # v2: i1 2/2, i2 1/2, i3 0/1 (one timeout not counted), i4 only timeouts: unscored
    assert table[("v2", "arith")]["items"] == 3 and table[("v2", "arith")]["pass@1"] == 0.5
    assert table[("v1", "(all)")]["pass@1"] == 0.375 and table[("v1", "arith")]["items"] == 4
    row = table[("v2", "arith")]
    assert row["low"] <= row["pass@1"] <= row["high"]

    md = (folder / "summary.md").read_text()
    assert "REJECTED" in md and gate.reason in md and "gate says no" in md
    assert "![training](training.png)" in md and "| groups trained | 5 |" in md
    assert json.loads((folder / "gate.json").read_text())["items"] == 3


def test_report_of_a_cycle_without_rows(lake, tmp_path):
    report = build_report(lake, "c/9", tmp_path)
    assert report.folder == tmp_path / "reports" / "c_9"  # a cycle id never escapes the reports folder
    assert all(r["rows"] == 0 for r in report.funnel) and report.evaluation == []
    assert (report.folder / "training.png").read_bytes()[:4] == b"\x89PNG"
    assert "_none_" in report.markdown


def test_the_kl_chart_says_what_the_kl_is_to():
    # kl_coef = 0 (the default) has no reference model: the trainer's KL is to the rollout policy
    assert kl_title([None, False]) == kl_title([]) == "KL to rollout policy (k3)"
    assert kl_title([False, True]) == "KL to reference (k3)"


def test_pass_at_1_per_cycle_in_start_order(lake):
    rows = pass_at_1_by_cycle(lake)
    assert [(r["cycle_id"], r["policy_version"], r["role"]) for r in rows] == [
        ("c1", "v1", "candidate"), ("c2", "v2", "candidate"), ("c2", "v1", "production")]
    assert [r["pass@1"] for r in rows] == [0.25, 0.5, 0.375]


def test_publish_as_prefect_artifacts(lake, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.testing.utilities import prefect_test_harness

    report = build_report(lake, "c2", tmp_path / "home")

    @flow
    def publish():
        return publish_report(report)

    with prefect_test_harness(server_startup_timeout=90):
        ids = publish()
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
                any_=["flywheel-funnel", "flywheel-evaluation", "flywheel-report"])))
    assert len(ids) == 5
    by_key = {a.key: a for a in found}
    assert set(by_key) == {"flywheel-funnel", "flywheel-evaluation", "flywheel-report"}
    assert "data:image/png;base64," in by_key["flywheel-report"].data
    assert "groups trained" in json.dumps(by_key["flywheel-funnel"].data)
