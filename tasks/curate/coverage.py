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
Incremental: `coverage_checks` says, per evaluation set version, up to which task
creation time every task has been checked against it (a task is checked against the
whole catalog when its log is curated). A run checks only the tasks newer than a
version's mark, so with no new set registered it checks none, however large the lake.
Not here: what the evaluation does with covered items, and writing (`tasks.curate.curation`
commits these rows, and the run's marks, together with its tasks and decisions).
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
CHECKS_TABLE = "coverage_checks"
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


@dataclass(frozen=True)
class CoverageRun:
    rows: list[dict]                     # as find_coverage gives them
    checked: list[tuple[str, str]]       # every (eval_set, eval_version) of the catalog
    tasks_checked: int                   # task x version-group checks run (0: nothing new)


def restricted(catalog: EvalCatalog, only: set[tuple[str, str]],
               cfg: decontaminate.DecontamConfig) -> EvalCatalog:
    """The part of `catalog` holding the (eval_set, eval_version) pairs in `only`."""
    kept = [(item, tuple(v for v in versions if (item.eval_set, v) in only))
            for item, versions in zip(catalog.index.items, catalog.versions)]
    kept = [(item, versions) for item, versions in kept if versions]
    if len(kept) == len(catalog.index.items) and all(len(v) == len(w) for (_, v), w in zip(kept, catalog.versions)):
        return catalog  # the usual case: nothing was checked yet, or everything again
    return EvalCatalog(decontaminate.build_eval_index([item for item, _ in kept], cfg),
                       tuple(versions for _, versions in kept))


def catalog_versions(catalog: EvalCatalog | None) -> list[tuple[str, str]]:
    """Every (eval_set, eval_version) the catalog holds."""
    if catalog is None:
        return []
    return sorted({(item.eval_set, v) for item, versions in zip(catalog.index.items, catalog.versions)
                   for v in versions})


def pending_coverage(con: duckdb.DuckDBPyConnection, catalog: EvalCatalog | None,
                     cfg: decontaminate.DecontamConfig) -> CoverageRun:
    """Coverage of every (task, set version) pair of `catalog` (the one this run's logs are
    checked against) no earlier run checked: per group of versions with one mark, the tasks
    created after it (every task, for a version never checked), against those versions."""
    known = catalog_versions(catalog)
    marks = {(s, v): mark for s, v, mark in con.execute(
        f"SELECT eval_set, eval_version, max(tasks_through) FROM lake.{CHECKS_TABLE} GROUP BY ALL").fetchall()}
    groups: dict[object, set[tuple[str, str]]] = {}
    for pair in known:
        groups.setdefault(marks.get(pair), set()).add(pair)
    rows: list[dict] = []
    checked = 0
    for mark, versions in groups.items():
        tasks = con.execute("SELECT task_id, prompt FROM lake.tasks WHERE ?::TIMESTAMPTZ IS NULL OR created_at > ? "
                            "ORDER BY created_at, task_id", [mark, mark]).fetchall()
        if tasks:
            part = restricted(catalog, versions, cfg)
            rows += find_coverage(part, [t for t, _ in tasks], [p for _, p in tasks], cfg)
            checked += len(tasks)
    return CoverageRun(sorted(rows, key=lambda r: tuple(r[k] for k in _KEY)), known, checked)


def check_marks(checked: list[tuple[str, str]], tasks_through: datetime, cycle_id: str) -> pa.Table:
    """The `coverage_checks` rows of a run: every version it knew, marked at its tasks' time."""
    return pa.Table.from_pylist([{"eval_set": s, "eval_version": v, "tasks_through": tasks_through,
                                  "cycle_id": cycle_id} for s, v in checked], schema=SCHEMAS[CHECKS_TABLE])


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
