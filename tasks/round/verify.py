"""The cycle's verify stage: every unscored rollout of a round gets one verdict row.

The rollout stage scores its own waves (adaptive sampling needs the verdicts to decide
what to sample next: tasks/round/adaptive.py) through `score_rollouts`; this stage
scores whatever a round holds unscored, e.g. rollouts sampled without a verifier config.

Rollouts are joined to their task for the verifier name and spec, scored through
`tasks.round.scoring.score_rows` (cheap verifiers in-process, sandboxed code fanned out on Dask), and written to
`verdicts` in one commit. Rollouts that already have a verdict are skipped, so a
rerun writes nothing twice.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from storage.lake import append_rows, transaction
from storage.schemas import SCHEMAS
from tasks.round.scoring import FanOut, score_rows
from verifiers.registry import VerifierConfig
from verifiers.verdict import INFRA_STATUSES

if TYPE_CHECKING:
    from tasks.stages import StageKey


@dataclass(frozen=True)
class VerifyStageConfig:
    verifiers: VerifierConfig = field(default_factory=VerifierConfig)
    fanout: FanOut = field(default_factory=FanOut)
    """Which rows go to Dask (an external DASK_SCHEDULER_ADDRESS when set, else a LocalCluster)."""


_PENDING_SQL = """
SELECT r.rollout_id, t.verifier, t.spec, t.prompt, r.completion
FROM lake.rollouts r JOIN lake.tasks t USING (task_id)
WHERE r.cycle_id = ? AND r.round = ?
  AND r.rollout_id NOT IN (SELECT rollout_id FROM lake.verdicts)
ORDER BY r.rollout_id
"""


def score_rollouts(rows: list[dict], cfg: VerifyStageConfig, cycle_id: str) -> pa.Table:
    """`verdicts` rows for rollout rows ({rollout_id, verifier, spec, prompt, completion}),
    in input order; the rollout stage scores its waves through this too."""
    results = score_rows(rows, cfg.verifiers, cfg.fanout)
    return pa.Table.from_pylist([{
        "rollout_id": r["rollout_id"], "verifier": r["verifier"], "reward": float(r["reward"]),
        "passed": bool(r["passed"]), "status": r["status"], "components": json.dumps(r["components"]),
        "detail": r["detail"], "latency_ms": r.get("latency_ms"), "cycle_id": cycle_id} for r in results],
        schema=SCHEMAS["verdicts"])


def verdict_counts(verdicts: pa.Table) -> dict:
    statuses = verdicts["status"].to_pylist()
    return {"verified": len(statuses), "passed": sum(bool(p) for p in verdicts["passed"].to_pylist()),
            "infra_failures": sum(s in INFRA_STATUSES for s in statuses),
            "hacking_suspected": statuses.count("hacking_suspected")}


def verify_stage(con: duckdb.DuckDBPyConnection, cycle_id: str, round_: int, cfg: VerifyStageConfig) -> dict:
    """Score the round's rollouts that have no verdict yet: all of them when they were
    sampled without scoring; none after the rollout stage scored its waves itself."""
    pending = con.execute(_PENDING_SQL, [cycle_id, round_]).fetchall()
    rows = [{"rollout_id": rid, "verifier": verifier, "spec": json.loads(spec), "prompt": prompt,
             "completion": completion} for rid, verifier, spec, prompt, completion in pending]
    table = score_rollouts(rows, cfg, cycle_id)
    with transaction(con, message=f"cycle {cycle_id}: verify round {round_}"):
        append_rows(con, "verdicts", table)
    return verdict_counts(table)


def run(con: duckdb.DuckDBPyConnection, cfg: VerifyStageConfig, key: StageKey) -> dict:
    """The verify stage: `verify_stage` for the key's cycle and round."""
    return verify_stage(con, key.cycle_id, key.round, cfg)
