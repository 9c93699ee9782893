"""Eval coverage: which evaluation items tasks already in the lake copy.

Decontamination keeps a log out of training when it copies a *registered* evaluation
item. The other direction matters when an evaluation set is registered after tasks
were made from earlier cycles' logs: some of its items may already be covered, and the
evaluation must exclude or flag them. This module runs the same detector
(`tasks.curate.decontaminate`: exact, n-gram overlap, MinHash) over the prompts of existing
tasks and turns each hit into `eval_coverage` rows, one per (eval_set, eval_version,
item_id, task_id) with the method and evidence, so one SQL query answers "which eval
items are covered, by which task, with what evidence".

A hit on one item also covers every item with the same strong normal form (the same
prompt in another set, or in several versions of one set; evidence names the item that
matched). A task that copies two *different* items reports only the one with the
strongest evidence, because `find_contamination` gives one item per prompt.
Not here: what the evaluation does with covered items, and writing (`tasks.curate.curation`
commits these rows together with its tasks and decisions).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import duckdb
import numpy as np
import pyarrow as pa

from storage.schemas import SCHEMAS
from tasks.curate import decontaminate
from tasks.curate.evalsets import eval_prompt_versions

COVERAGE_TABLE = "eval_coverage"
_KEY = ("eval_set", "eval_version", "item_id", "task_id")


@dataclass(frozen=True)
class EvalCatalog:
    """Every distinct (eval_set, item_id, prompt) of the lake, the versions holding it
    (row for row with `index.items`), and its decontamination index."""

    index: decontaminate.EvalIndex
    versions: tuple[tuple[str, ...], ...]


def load_catalog(con: duckdb.DuckDBPyConnection, cfg: decontaminate.DecontamConfig) -> EvalCatalog | None:
    """The catalog of every registered item of every version; None when there is none."""
    rows = eval_prompt_versions(con)
    if not rows:
        return None
    items = [decontaminate.EvalItem(eval_set, item_id, prompt) for eval_set, item_id, prompt, _ in rows]
    return EvalCatalog(decontaminate.build_eval_index(items, cfg), tuple(tuple(r[3]) for r in rows))


def _identical_items(index: decontaminate.EvalIndex) -> list[np.ndarray]:
    """For each item, the items with the same strong normal form (itself included)."""
    bounds = np.flatnonzero(np.diff(index.whole)) + 1
    groups = np.split(index.whole_item, bounds)
    out: list[np.ndarray] = [np.empty(0, np.int64)] * len(index.items)
    for group in groups:
        for item in group.tolist():
            out[item] = np.sort(group)
    return out


def find_coverage(catalog: EvalCatalog | None, task_ids: list[str], prompts: list[str],
                  cfg: decontaminate.DecontamConfig) -> list[dict]:
    """One row (without bookkeeping columns) per (eval_set, eval_version, item_id,
    task_id) where the task's prompt copies the item; sorted by that key."""
    if catalog is None or not prompts:
        return []
    index = catalog.index
    same = _identical_items(index)
    rows: dict[tuple, dict] = {}
    for hit in decontaminate.find_contamination(prompts, index, cfg):
        matched = index.items[hit.item]
        evidence = {k: v for k, v in hit.evidence.items() if k not in ("eval_set", "item_id", "method")}
        for item in same[hit.item].tolist():
            covered = index.items[item]
            detail = evidence if item == hit.item else {
                **evidence, "same_prompt_as": {"eval_set": matched.eval_set, "item_id": matched.item_id}}
            for version in catalog.versions[item]:
                key = (covered.eval_set, version, covered.item_id, task_ids[hit.record])
                rows.setdefault(key, {**dict(zip(_KEY, key)), "method": hit.method,
                                      "evidence": json.dumps(detail, sort_keys=True)})
    return [rows[key] for key in sorted(rows)]


def new_coverage_rows(con: duckdb.DuckDBPyConnection, rows: list[dict], cycle_id: str,
                      now: datetime) -> pa.Table:
    """The rows whose key `eval_coverage` does not hold yet, as a table of its schema:
    a rerun, or a later cycle finding the same coverage, adds nothing."""
    have = set(con.execute(f"SELECT {', '.join(_KEY)} FROM lake.{COVERAGE_TABLE}").fetchall())
    fresh = [{**r, "created_at": now, "cycle_id": cycle_id} for r in rows
             if tuple(r[k] for k in _KEY) not in have]
    return pa.Table.from_pylist(fresh, schema=SCHEMAS[COVERAGE_TABLE])


def covered_item_count(con: duckdb.DuckDBPyConnection) -> int:
    """How many evaluation items (of any version) tasks in the lake copy."""
    return con.execute("SELECT count(DISTINCT (eval_set, item_id)) FROM lake.eval_coverage").fetchone()[0]
