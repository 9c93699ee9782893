"""Lake maintenance deletes the training checkpoints of completed cycles, except production's."""
from datetime import datetime, timezone

import pyarrow as pa

from storage.lake import append_rows, open_lake, transaction
from storage.schemas import SCHEMAS
from tasks.round.checkpoints import drop_finished_checkpoints
from trainer.job import jobs_root

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
MODELS = [  # version, status, cycle
    ("v0", "retired", "c1"), ("v1", "rejected", "c1"), ("v2", "production", "c2"), ("v3", "candidate", "c2"),
    ("v4", "candidate", "c3"), ("v5", "candidate", "c4")]
CYCLES = {"c1": "completed", "c2": "completed", "c3": "failed", "c4": "running"}


def _job(root, version: str, checkpoint_bytes: int) -> None:
    (root / version / "checkpoints" / "step_8").mkdir(parents=True)
    (root / version / "checkpoints" / "step_8" / "optim_states.pt").write_bytes(b"x" * checkpoint_bytes)
    (root / version / "checkpoints" / "latest").write_text("step_8")
    (root / version / "model").mkdir()
    (root / version / "model" / "model.safetensors").write_bytes(b"w")


def test_only_checkpoints_of_completed_cycles_other_than_productions_go(lake_settings):
    con = open_lake(lake_settings)
    with transaction(con):
        append_rows(con, "models", pa.Table.from_pylist([
            {"policy_version": v, "parent_version": None, "uri": f"m/{v}", "status": s, "reason": None,
             "created_at": T0, "cycle_id": c} for v, s, c in MODELS], schema=SCHEMAS["models"]))
        append_rows(con, "cycles", pa.Table.from_pylist([
            {"cycle_id": c, "started_at": T0, "finished_at": None if s == "running" else T0, "status": s,
             "snapshot_id": None, "stage_seconds": "{}", "stage_counts": "{}", "reason": None}
            for c, s in CYCLES.items()], schema=SCHEMAS["cycles"]))
    root = jobs_root(lake_settings.home)
    for version, *_ in MODELS + [("v-killed-job",)]:  # a job no models row names yet
        _job(root, version, 1000)
    dropped = drop_finished_checkpoints(con, root)
    assert (dropped.jobs, dropped.bytes) == (3, 3 * 1000 + 3 * len("step_8"))
    kept = sorted(p.parent.name for p in root.glob("*/checkpoints"))
    assert kept == ["v-killed-job", "v2", "v4", "v5"]  # production, failed (rerun resumes), running, unknown
    assert len(list(root.glob("*/model/model.safetensors"))) == len(MODELS) + 1  # weights stay
    assert drop_finished_checkpoints(con, root).jobs == 0  # nothing left to do
