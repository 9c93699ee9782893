"""Where a cycle stands: the stages' wall time counted once where overlapped rounds ran two
at once; a rerun of a cycle continues it, and a rerun of a completed one leaves its row be."""
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from storage.lake import append_rows, current_snapshot, open_lake, transaction
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.cycle.state import begin_cycle, busy_seconds, finish_cycle, run_stage


def test_busy_seconds_counts_overlapping_stages_once():
    # rollout 0, then train 0 beside rollout 1 (overlapped rounds), a gap, evaluate
    spans = [(0.0, 10.0), (10.0, 40.0), (12.0, 30.0), (50.0, 55.0)]
    assert busy_seconds(spans) == 45.0
    assert busy_seconds([(5.0, 6.0), (0.0, 10.0)]) == 10.0  # one span inside another
    assert busy_seconds([]) == 0.0


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A lake with a production model, as the cycle's state functions find it (env)."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "absent.toml"))
    con = open_lake(LakeSettings(home=tmp_path / "home"))
    with transaction(con, message="a production model"):
        append_rows(con, "models", pa.Table.from_pylist([{
            "policy_version": "p0", "status": "production", "reason": "test",
            "created_at": datetime.now(timezone.utc)}], schema=SCHEMAS["models"]))
    con.close()
    return tmp_path / "home"


def cycle_row(home, cycle_id: str) -> tuple:
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        return con.execute("SELECT status, snapshot_id, finished_at, reason FROM lake.cycles WHERE cycle_id = ?",
                           [cycle_id]).fetchone()
    finally:
        con.close()


def run_cycle(cycle_id: str, work) -> dict:
    assert begin_cycle(cycle_id) == "p0"
    run_stage(cycle_id, "ingest", work)
    return finish_cycle(cycle_id, "completed")


def test_a_completed_cycle_rerun_keeps_the_snapshot_it_ended_on(home):
    first = run_cycle("c1", lambda con: {"logs": 1})
    before = cycle_row(home, "c1")
    assert before[:2] == ("completed", first["snapshot_id"])
    run_cycle("c2", lambda con: {"logs": 2})  # later work in the lake

    def must_not_run(con):
        raise AssertionError("a finished stage ran again")

    again = run_cycle("c1", must_not_run)
    assert again["snapshot_id"] == first["snapshot_id"] and again["stage_counts"] == first["stage_counts"]
    assert cycle_row(home, "c1") == before  # `flywheel sql --snapshot N` still shows the lake c1 left
    finish_cycle("c1", "failed", reason="a rerun failed")
    assert cycle_row(home, "c1") == before


def test_a_failed_cycle_rerun_runs_its_unfinished_stages_and_ends_on_a_new_snapshot(home):
    assert begin_cycle("c1") == "p0"
    finish_cycle("c1", "failed", reason="boom")
    assert cycle_row(home, "c1")[0] == "failed"
    again = run_cycle("c1", lambda con: {"logs": 1})
    con = open_lake(LakeSettings(home=home), read_only=True)
    assert again["snapshot_id"] == current_snapshot(con)
    con.close()
    assert cycle_row(home, "c1")[0::3] == ("completed", None)
