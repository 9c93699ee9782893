"""Where a cycle stands: which stages finished, and the `cycles` row itself.

Every stage of a cycle runs through `run_stage`: if the lake already records the
stage (and round) as finished for this cycle, its recorded counts are returned and
nothing runs again, so rerunning a failed cycle continues from the first stage that
did not finish. Stages are idempotent on their own (content-hash ids, skip what is
already written), so a crash between a stage's commit and its marker only costs
the work of checking again, never duplicate rows.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone

import duckdb
import pyarrow as pa

from storage.config_file import lake_settings
from storage.lake import append_rows, current_snapshot, open_lake, transaction
from storage.lake_turn import lake_turn
from storage.schemas import SCHEMAS
from tasks.release.models import production_version


def stage_record(con: duckdb.DuckDBPyConnection, cycle_id: str, stage: str, round_: int) -> dict | None:
    row = con.execute("SELECT counts, seconds FROM lake.cycle_stages WHERE cycle_id = ? AND stage = ? "
                      "AND round = ?", [cycle_id, stage, round_]).fetchone()
    return None if row is None else {**json.loads(row[0]), "seconds": row[1], "resumed": True}


def record_stage(con: duckdb.DuckDBPyConnection, cycle_id: str, stage: str, round_: int,
                 seconds: float, counts: dict) -> None:
    with transaction(con, message=f"cycle {cycle_id}: {stage} round {round_} done"):
        append_rows(con, "cycle_stages", pa.Table.from_pylist([{
            "stage": stage, "round": round_, "seconds": seconds, "counts": json.dumps(counts),
            "finished_at": datetime.now(timezone.utc), "cycle_id": cycle_id}], schema=SCHEMAS["cycle_stages"]))


def run_stage(cycle_id: str, stage: str, work: Callable[[duckdb.DuckDBPyConnection], dict],
              round_: int = 0) -> dict:
    """Run `work(con)` once per (cycle, stage, round); return its counts (plus seconds).
    The stage has this process's turn on the lake (storage/lake_turn.py) except while it
    waits on a worker process, so an overlapped cycle's stages never collide on it."""
    with lake_turn():
        con = open_lake(lake_settings())
        try:
            done = stage_record(con, cycle_id, stage, round_)
            if done is not None:
                return done
            started = time.perf_counter()
            counts = work(con)
            seconds = time.perf_counter() - started
            record_stage(con, cycle_id, stage, round_, seconds, counts)
            return {**counts, "seconds": seconds, "resumed": False}
        finally:
            con.close()


def begin_cycle(cycle_id: str) -> str:
    """Insert the cycle's row as `running` unless a rerun finds it already there; return
    the production model the cycle starts from."""
    with lake_turn():
        return _begin_cycle(cycle_id)


def _begin_cycle(cycle_id: str) -> str:
    con = open_lake(lake_settings())
    try:
        row = con.execute("SELECT status FROM lake.cycles WHERE cycle_id = ?", [cycle_id]).fetchone()
        if row is not None:
            if row[0] != "completed":  # a completed cycle rerun stays completed (_finish_cycle)
                with transaction(con):
                    con.execute("UPDATE lake.cycles SET status = 'running', reason = NULL WHERE cycle_id = ?",
                                [cycle_id])
            return production_version(con)
        with transaction(con, message=f"cycle {cycle_id} started"):
            append_rows(con, "cycles", pa.Table.from_pylist([{
                "started_at": datetime.now(timezone.utc), "finished_at": None, "status": "running",
                "snapshot_id": None, "stage_seconds": "{}", "stage_counts": "{}", "reason": None,
                "cycle_id": cycle_id}], schema=SCHEMAS["cycles"]))
        # after the row exists: a cycle without a production model is recorded as failed
        return production_version(con)
    finally:
        con.close()


def finish_cycle(cycle_id: str, status: str, reason: str | None = None) -> dict:
    """Close the cycle's row: status, per-stage seconds and counts, the snapshot it ended on."""
    with lake_turn():
        return _finish_cycle(cycle_id, status, reason)


def _finish_cycle(cycle_id: str, status: str, reason: str | None) -> dict:
    con = open_lake(lake_settings())
    try:
        rows = con.execute("SELECT stage, round, seconds, counts, epoch(finished_at) FROM lake.cycle_stages "
                           "WHERE cycle_id = ? ORDER BY finished_at", [cycle_id]).fetchall()
        seconds: dict[str, float] = {}
        counts: dict[str, dict] = {}
        busy = busy_seconds([(end - secs, end) for _, _, secs, _, end in rows])
        for stage, round_, secs, stage_counts, _ in rows:
            seconds[stage] = seconds.get(stage, 0.0) + secs
            counts[stage if stage not in counts else f"{stage}#{round_}"] = json.loads(stage_counts)
        done = con.execute("SELECT snapshot_id, reason, epoch(finished_at) FROM lake.cycles "
                           "WHERE cycle_id = ? AND status = 'completed'", [cycle_id]).fetchone()
        if done is not None and all(end <= done[2] for *_, end in rows):
            # A rerun of a completed cycle that ran no stage: the lake as the cycle left it is
            # still its snapshot (`flywheel sql --snapshot N`), not one after later cycles' work,
            # and a rerun that fails does not undo a cycle that completed.
            return {"cycle_id": cycle_id, "status": "completed", "snapshot_id": done[0], "stage_seconds": seconds,
                    "busy_seconds": busy, "stage_counts": counts, "reason": done[1]}
        with transaction(con, message=f"cycle {cycle_id} {status}"):
            # the snapshot this commit creates is the one the cycle "ended on"
            snapshot = current_snapshot(con) + 1
            con.execute("UPDATE lake.cycles SET status = ?, reason = ?, finished_at = ?, snapshot_id = ?, "
                        "stage_seconds = ?, stage_counts = ? WHERE cycle_id = ?",
                        [status, reason, datetime.now(timezone.utc), snapshot, json.dumps(seconds),
                         json.dumps(counts), cycle_id])
        return {"cycle_id": cycle_id, "status": status, "snapshot_id": snapshot, "stage_seconds": seconds,
                "busy_seconds": busy, "stage_counts": counts, "reason": reason}
    finally:
        con.close()


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Wall time covered by at least one of the (start, end) spans: the stages' time,
    counted once where overlapped rounds ran two stages at once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
