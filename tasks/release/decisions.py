"""The gate as a stage: both models' per-item scores from `evaluations` -> the pure
`gate.decide` -> one `gate_decisions` row; and the recorded decision read back by
`promote` and the report.

The decision is a table, not a value passed between tasks: a rerun, the report, the
`evaluate` flow and a person with `flywheel sql` all read the same row. This module
decides nothing itself (tasks.release.gate does) and changes no model's status
(tasks.release.promote does).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import duckdb
import polars as pl
import pyarrow as pa

from storage.lake import append_rows, transaction
from storage.schemas import SCHEMAS
from tasks.release import passk
from tasks.release.gate import GateConfig, GateDecision, decide

if TYPE_CHECKING:
    from tasks.stages import StageKey

NOTHING_TRAINED = "no new candidate this cycle (nothing was trained)"

_SAMPLES_SQL = """
SELECT eval_set, item_id, domain, status, passed FROM lake.evaluations
WHERE policy_version = ? AND cycle_id = ? AND NOT coalesce(contaminated, false)
"""


def item_scores(con: duckdb.DuckDBPyConnection, policy_version: str, cycle_id: str) -> list[dict]:
    """Per clean item the model was judged on: n judged samples, c passed, score = c / n.

    The gate's input, counted as the evaluate stage counts its fresh samples
    (`passk.item_scores`); an item with no judged sample is left out.
    """
    samples = pl.from_arrow(con.execute(_SAMPLES_SQL, [policy_version, cycle_id]).to_arrow_table())
    return [score for score in passk.item_scores(samples) if score["n"] > 0]


def run(con: duckdb.DuckDBPyConnection, cfg: GateConfig, key: StageKey) -> dict:
    """The gate stage: decide on the key's candidate (`policy`) against `production`."""
    if key.policy == key.production:
        return {"decision": None, "reason": NOTHING_TRAINED}
    decision = decide(item_scores(con, key.policy, key.cycle_id), item_scores(con, key.production, key.cycle_id),
                      cfg)
    row = {"candidate": key.policy, "production": key.production, "promoted": decision.promoted,
           "reason": decision.reason, "decision": json.dumps(decision.to_dict()),
           "decided_at": datetime.now(timezone.utc), "cycle_id": key.cycle_id}
    with transaction(con, f"gate on {key.policy[:12]} in {key.cycle_id}: "
                          f"{'promote' if decision.promoted else 'reject'}"):
        con.execute("DELETE FROM lake.gate_decisions WHERE cycle_id = ? AND candidate = ?",
                    [key.cycle_id, key.policy])
        append_rows(con, "gate_decisions", pa.Table.from_pylist([row], schema=SCHEMAS["gate_decisions"]))
    return {"decision": decision.to_dict(), "reason": decision.reason}


def recorded_decision(con: duckdb.DuckDBPyConnection, cycle_id: str,
                      candidate: str | None = None) -> GateDecision | None:
    """The gate's decision of this cycle (on `candidate`, when given), or None."""
    row = con.execute("SELECT decision FROM lake.gate_decisions WHERE cycle_id = ? AND candidate = coalesce(?, "
                      "candidate) ORDER BY decided_at DESC LIMIT 1", [cycle_id, candidate]).fetchone()
    return GateDecision.from_dict(json.loads(row[0])) if row else None
