"""The lake's tasks as the duplicate check sees them: band keys in a lake table, joined in DuckDB.

A new log can only be a near duplicate of a task whose LSH band keys meet its own, so
curation never holds every task in memory. Each kept task's keys are written once, in
the commit that writes the task (`task_bands`: one row per task and banding, its keys a
list of `bands` uint64), and a batch's keys are joined against that table in DuckDB.
The join reads one column and keeps only the batch's side in memory: 0.55 s for a 10k
batch at 824k tasks (bench/growth.py), where streaming every signature into Python and
sorting every band's keys took 5.4 s + 8.7 s and ~0.3 GB, growing with the lake. Exact
duplicates are a semi-join of the batch's task ids against `tasks`.

Tasks written before band keys were kept, or under another banding, get theirs from their
stored signature (or from their prompt, when it has none) by `backfill`, which curate
runs before its first chunk: once per lake and banding, committed a block at a time, so
a crash midway leaves only the rest for the next run.
"""
from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from storage.lake import append_rows, transaction
from storage.schemas import SCHEMAS
from tasks.curate.similarity import minhash

BANDS_TABLE = "task_bands"
SIGNATURES_TABLE = "minhash_signatures"


@dataclass(frozen=True)
class ExistingTasks:
    """The tasks a batch is deduplicated against: the lake's (`con`), or none."""

    cfg: minhash.MinHashConfig
    con: duckdb.DuckDBPyConnection | None = None

    @classmethod
    def none(cls, cfg: minhash.MinHashConfig) -> ExistingTasks:
        return cls(cfg)

    def known(self, task_ids: list[str]) -> set[str]:
        """Those of `task_ids` that are tasks already."""
        return known_tasks(self.con, task_ids) if self.con is not None and task_ids else set()

    def partners(self, keys: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """(rows, task_ids), unique pairs: task `task_ids[i]` shares a band key with
        row `rows[i]` of the (n, bands) `keys`."""
        if self.con is None or not len(keys):
            return np.empty(0, np.int64), []
        return band_partners(self.con, keys, self.cfg.banding_scheme)

    def prompts(self, task_ids: list[str]) -> dict[str, str]:
        return fetch_prompts(self.con, task_ids) if self.con is not None and task_ids else {}


def _ids_table(task_ids: list[str]) -> pa.Table:
    return pa.table({"task_id": pa.array(task_ids, pa.string())})


def known_tasks(con: duckdb.DuckDBPyConnection, task_ids: list[str]) -> set[str]:
    con.register("_flywheel_ids", _ids_table(task_ids))
    try:
        return {r[0] for r in con.execute("SELECT task_id FROM lake.tasks SEMI JOIN _flywheel_ids USING (task_id)")
                .fetchall()}
    finally:
        con.unregister("_flywheel_ids")


def fetch_prompts(con: duckdb.DuckDBPyConnection, task_ids: list[str]) -> dict[str, str]:
    """task id -> prompt, for those of `task_ids` that are tasks."""
    con.register("_flywheel_ids", _ids_table(task_ids))
    try:
        return dict(con.execute("SELECT task_id, prompt FROM lake.tasks SEMI JOIN _flywheel_ids USING (task_id)")
                    .fetchall())
    finally:
        con.unregister("_flywheel_ids")


def band_partners(con: duckdb.DuckDBPyConnection, keys: np.ndarray, banding: str) -> tuple[np.ndarray, list[str]]:
    n, bands = keys.shape
    probe = pa.table({"row": np.repeat(np.arange(n, dtype=np.int64), bands),
                      "band": np.tile(np.arange(1, bands + 1, dtype=np.int64), n),
                      "key": np.ascontiguousarray(keys, dtype=np.uint64).ravel()})
    con.register("_flywheel_probe", probe)
    try:
        found = con.execute(f"""
            SELECT DISTINCT p.row, b.task_id FROM _flywheel_probe p JOIN (
                SELECT task_id, unnest(keys) AS key, generate_subscripts(keys, 1) AS band
                FROM lake.{BANDS_TABLE} WHERE banding = ?) b ON b.band = p.band AND b.key = p.key""",
                            [banding]).to_arrow_table()
    finally:
        con.unregister("_flywheel_probe")
    return found.column("row").to_numpy(), found.column("task_id").to_pylist()


def band_rows(task_ids: list[str], keys: np.ndarray, banding: str, cycle_id: str) -> pa.Table:
    """`task_bands` rows for (n, bands) `keys`, row i belonging to task_ids[i]."""
    n, bands = keys.shape
    offsets = pa.array(np.arange(0, n * bands + 1, bands, dtype=np.int32))
    lists = pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(keys, dtype=np.uint64).ravel()))
    return pa.Table.from_arrays([pa.array(task_ids, pa.string()), pa.array([banding] * n, pa.string()), lists,
                                 pa.array([cycle_id] * n, pa.string())], schema=SCHEMAS[BANDS_TABLE])


def _unbanded(con: duckdb.DuckDBPyConnection, banding: str) -> list[str]:
    return [r[0] for r in con.execute(
        f"SELECT task_id FROM lake.tasks ANTI JOIN (SELECT task_id FROM lake.{BANDS_TABLE} WHERE banding = ?) "
        "USING (task_id) ORDER BY task_id", [banding]).fetchall()]


def backfill(con: duckdb.DuckDBPyConnection, cfg: minhash.MinHashConfig, cycle_id: str,
             block: int = 65536) -> int:
    """Write band keys for every task that has none under this banding; how many it wrote.

    Keys come from the task's stored signature, read `block` rows at a time and unsorted
    (no join of a million 512-byte rows has to fit DuckDB's memory), else from its prompt.
    The keys are gathered before any is written: a write would end the open read."""
    missing = _unbanded(con, cfg.banding_scheme)
    if not missing:
        return 0
    todo, ids, keys = set(missing), [], []
    con.register("_flywheel_ids", _ids_table(missing))
    try:
        result = con.execute(f"SELECT task_id, signature FROM lake.{SIGNATURES_TABLE} "
                             "SEMI JOIN _flywheel_ids USING (task_id) WHERE scheme = ?", [cfg.scheme])
        while rows := result.fetchmany(block):
            rows = [r for r in rows if r[0] in todo]
            todo.difference_update(r[0] for r in rows)  # a task signed twice counts once
            sigs = np.stack([np.frombuffer(blob, dtype="<u4") for _, blob in rows]) if rows else None
            if sigs is not None:
                ids += [r[0] for r in rows]
                keys.append(minhash.band_keys(sigs, cfg))
    finally:
        con.unregister("_flywheel_ids")
    unsigned = sorted(todo)  # written before signatures were kept, or under another scheme
    for start in range(0, len(unsigned), block):
        part = unsigned[start:start + block]
        prompts = fetch_prompts(con, part)
        keys.append(minhash.sketch_texts([prompts[t] for t in part], cfg).keys)
        ids += part
    all_keys = np.concatenate(keys)
    for start in range(0, len(ids), block):
        with transaction(con, f"curate {cycle_id}: band keys of {min(block, len(ids) - start)} earlier tasks"):
            append_rows(con, BANDS_TABLE, band_rows(ids[start:start + block], all_keys[start:start + block],
                                                    cfg.banding_scheme, cycle_id))
    return len(ids)
