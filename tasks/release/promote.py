"""Model statuses: the gate's decision and the manual override, written to `models`.

A model is `candidate` when trained, then `production` (promoted by the gate or by
hand), `rejected` (the gate said no) or `retired` (it was production until another
model was promoted). Exactly one model is production after any promotion: the new
one's row and the old one's row change in one DuckLake commit, with UPDATE (a status
is a fact about the model now; its history is DuckLake's snapshots, e.g.
`flywheel sql --snapshot N "SELECT * FROM models"`, and each commit's message says who
decided: `gate` or `manual`). `reason` always says why, and a manual decision's reason
starts with "manual", so an override is never mistaken for the gate's.
Rollback is a manual promotion of an older model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

from storage.lake import transaction
from tasks.release.decisions import NOTHING_TRAINED, recorded_decision
from tasks.release.gate import GateDecision
from tasks.release.models import retire_production, weights_deleted
from tasks.reports.cycle_report import pass_at_1_by_cycle

if TYPE_CHECKING:
    from tasks.stages import StageKey


class ModelError(ValueError):
    """The named model cannot be promoted; the message says what to do instead."""


@dataclass(frozen=True)
class Promotion:
    version: str
    previous: tuple[str, ...]  # models that were production and are now retired
    changed: bool  # False: it already was the production model


def promote(con: duckdb.DuckDBPyConnection, version: str, reason: str, *, manual: bool = True) -> Promotion:
    """Make `version` the production model and retire the one(s) before it, in one commit."""
    who = "manual" if manual else "gate"
    with transaction(con, f"model promote {version} ({who})"):
        row = con.execute("SELECT status, weights_deleted_at FROM lake.models WHERE policy_version = ?",
                          [version]).fetchone()
        if row is None:
            raise ModelError(f"no model {version!r} in the lake; `flywheel model list` shows the versions")
        if row[1] is not None:
            raise ModelError(weights_deleted(version, row[1]))
        previous = retire_production(con, version, f"{who}: superseded by {version}: {reason}")
        if row[0] == "production" and not previous:
            return Promotion(version, (), changed=False)
        text = f"manual override: {reason}" if manual else reason
        con.execute("UPDATE lake.models SET status = 'production', reason = ? WHERE policy_version = ?",
                    [text, version])
    return Promotion(version, previous, changed=True)


def record_gate(con: duckdb.DuckDBPyConnection, version: str, decision: GateDecision, cycle_id: str) -> Promotion:
    """Apply the gate's decision to the candidate `version`."""
    reason = f"gate in cycle {cycle_id}: {decision.reason}"
    if decision.promoted:
        return promote(con, version, reason, manual=False)
    with transaction(con, f"model reject {version} (gate)"):
        updated = con.execute("UPDATE lake.models SET status = 'rejected', reason = ? WHERE policy_version = ?",
                              [reason, version]).fetchone()
    if not updated or not updated[0]:
        raise ModelError(f"no model {version!r} in the lake to reject")
    return Promotion(version, (), changed=False)


def list_models(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """Every model, oldest first, with its latest evaluation's pass@1 (None if never evaluated)."""
    latest = {r["policy_version"]: r for r in pass_at_1_by_cycle(con)}  # cycle order: the last one wins
    rows = con.execute("SELECT policy_version, parent_version, status, reason, created_at, uri, cycle_id, "
                       "weights_deleted_at FROM lake.models ORDER BY created_at, policy_version").fetchall()
    out = []
    for version, parent, status, reason, created_at, uri, cycle_id, deleted_at in rows:
        score = latest.get(version)
        out.append({"policy_version": version, "parent_version": parent, "status": status, "reason": reason,
                    "created_at": created_at, "uri": uri, "cycle_id": cycle_id, "weights_deleted_at": deleted_at,
                    "pass@1": score["pass@1"] if score else None,
                    "evaluated_in": score["cycle_id"] if score else None})
    return out


def run(con: duckdb.DuckDBPyConnection, cfg: None, key: StageKey) -> dict:
    """The promote stage: apply the gate's recorded decision on the key's candidate."""
    if key.policy == key.production:
        return {"promoted": False, "reason": NOTHING_TRAINED}
    decision = recorded_decision(con, key.cycle_id, key.policy)
    if decision is None:
        return {"promoted": False, "reason": "no decision: the gate recorded none for this candidate"}
    record_gate(con, key.policy, decision, key.cycle_id)
    return {"promoted": decision.promoted, "reason": decision.reason}
