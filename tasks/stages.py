"""The stages of a cycle: one contract, one ordered table.

Every stage is a plain function `run(con, cfg, key) -> counts`:
- `con` is an open lake connection; the stage reads its input tables and writes its
  output tables in its own DuckDB transaction(s), committing last;
- `cfg` is the stage's frozen config dataclass (its section of `[cycle]`, after a run's
  overrides; `None` for a stage that has no settings);
- `key` says which unit of work this is (`StageKey`: small values only);
- `counts` is a small JSON-able dict of what it did, recorded in `cycle_stages`.
A stage is testable without Prefect; tasks/cycle/prefect_tasks.py runs any of them as
one generic Prefect task, with the retries this table gives (only stages that do
network or object-store I/O retry: a retried computation only repeats its crash).
Stages are idempotent on their own (content-hash ids, skip what is written), so a
rerun of a cycle skips finished stages and redoes the rest.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb

from tasks.curate import curation
from tasks.ingest import batch
from tasks.release import decisions, evaluate, promote
from tasks.round import rollout, train, verify


@dataclass(frozen=True)
class StageKey:
    """Which unit of work a stage does."""

    cycle_id: str
    """The cycle (or evaluation) the stage works for; every row it writes carries it."""
    round: int = 0
    """The training round (rollout, verify, train); 0 for once-per-cycle stages."""
    policy: str = ""
    """The model the stage works on: the policy sampled and trained (round stages), the
    candidate evaluated, gated and promoted (release stages)."""
    behaviour: str = ""
    """The policy that sampled the round's rollouts, when it is older than `policy` (the
    train stage of an overlapped cycle: at most `[cycle.rollout] max_staleness` versions
    older); empty: `policy` itself."""
    production: str = ""
    """The model the candidate is compared with (release stages)."""
    landing: tuple[str, ...] = ()
    """Files, folders or s3:// prefixes to ingest; empty: the configured landing."""


@dataclass(frozen=True)
class Stage:
    run: Callable[[duckdb.DuckDBPyConnection, Any, StageKey], dict]
    config: str | tuple[str, ...] | None
    """The `CycleConfig` field (`[cycle.<name>]`) the stage takes; a tuple: the stage takes
    those sections as a tuple (the rollout stage scores with the verify section's
    verifiers); None: no settings."""
    retries: int = 0


# In pipeline order.
STAGES: dict[str, Stage] = {
    "ingest": Stage(batch.run, "ingest", retries=2),
    "curate": Stage(curation.run, "curate"),
    "rollout": Stage(rollout.run, ("rollout", "verify")),
    "verify": Stage(verify.run, "verify"),
    "train": Stage(train.run, "train"),
    "evaluate": Stage(evaluate.run, "evaluate"),
    "gate": Stage(decisions.run, "gate"),
    "promote": Stage(promote.run, None),
}
