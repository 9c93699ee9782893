"""Model statuses: the gate's decision, manual override and rollback, one production model."""
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from storage.lake import append_rows, open_lake, transaction
from storage.schemas import SCHEMAS
from tasks.release.gate import GateConfig, decide
from tasks.release.promote import ModelError, list_models, promote, record_gate

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


@pytest.fixture
def lake(lake_settings):
    con = open_lake(lake_settings)
    models = [{"policy_version": v, "parent_version": p, "uri": f"m/{v}", "status": s, "reason": None,
               "created_at": T0 + timedelta(hours=i), "cycle_id": c}
              for i, (v, p, s, c) in enumerate([("v0", None, "production", "init"), ("v1", "v0", "candidate", "c1"),
                                                ("v2", "v1", "candidate", "c2")])]
    evals = [{"policy_version": "v1", "eval_set": "s", "item_id": f"i{k}", "domain": "math", "sample_idx": 0,
              "reward": 1.0, "passed": k < 3, "status": "ok" if k < 3 else "wrong", "completion_tokens": 3,
              "finish_reason": "stop", "cycle_id": "c1"} for k in range(4)]
    with transaction(con):
        append_rows(con, "models", pa.Table.from_pylist(models, schema=SCHEMAS["models"]))
        append_rows(con, "evaluations", pa.Table.from_pylist(evals, schema=SCHEMAS["evaluations"]))
    yield con
    con.close()


def _status(con):
    return dict(con.execute("SELECT policy_version, status FROM lake.models").fetchall())


def test_gate_promotes_and_rejects(lake):
    win = decide([{"eval_set": "s", "item_id": f"i{k}", "domain": "m", "score": 1.0} for k in range(30)],
                 [{"eval_set": "s", "item_id": f"i{k}", "domain": "m", "score": 0.0} for k in range(30)], GateConfig())
    result = record_gate(lake, "v1", win, "c1")
    assert result.previous == ("v0",) and _status(lake) == {"v0": "retired", "v1": "production", "v2": "candidate"}
    reasons = dict(lake.execute("SELECT policy_version, reason FROM lake.models").fetchall())
    assert reasons["v1"].startswith("gate in cycle c1: promoted") and "superseded by v1" in reasons["v0"]

    loss = decide([{"eval_set": "s", "item_id": "i0", "domain": "m", "score": 0.0}],
                  [{"eval_set": "s", "item_id": "i0", "domain": "m", "score": 1.0}], GateConfig())
    record_gate(lake, "v2", loss, "c2")
    assert _status(lake)["v2"] == "rejected" and _status(lake)["v1"] == "production"
    with pytest.raises(ModelError, match="no model"):
        record_gate(lake, "nope", loss, "c2")


def test_manual_override_and_rollback_are_recorded_as_manual(lake):
    promote(lake, "v2", "hotfix", manual=True)
    assert _status(lake) == {"v0": "retired", "v1": "candidate", "v2": "production"}
    assert lake.execute("SELECT reason FROM lake.models WHERE policy_version = 'v2'").fetchone()[0] == \
        "manual override: hotfix"
    promote(lake, "v0", "v2 misbehaves")  # rollback
    assert [v for v, s in _status(lake).items() if s == "production"] == ["v0"]
    message = lake.execute("SELECT commit_message FROM lake.snapshots() ORDER BY snapshot_id DESC "
                           "LIMIT 1").fetchone()[0]
    assert message == "model promote v0 (manual)"
    assert not promote(lake, "v0", "again").changed
    with pytest.raises(ModelError, match="flywheel model list"):
        promote(lake, "v9", "typo")


def test_list_models_with_headline_scores(lake):
    rows = {r["policy_version"]: r for r in list_models(lake)}
    assert list(rows) == ["v0", "v1", "v2"]
    assert rows["v1"]["pass@1"] == 0.75 and rows["v1"]["evaluated_in"] == "c1"
    assert rows["v0"]["pass@1"] is None and rows["v2"]["parent_version"] == "v1"
