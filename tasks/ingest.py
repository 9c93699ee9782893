"""Ingest: landed failure-log files become `failure_logs` rows, bad lines `quarantine` rows.

A file is one batch (`batch_id` = sha256 of its bytes). Files are read in chunks
(tasks/ingest_lines.py); DuckDB derives each chunk's features and rows
(tasks/ingest_features.py), the Great Expectations suite (tasks/log_checks.py)
decides which lines are valid, and the valid rows are staged as Parquet. The whole
batch becomes visible in one DuckLake commit, so memory does not grow with the file,
a crash leaves no partial rows, and a rerun ingests the batch exactly once. A batch
already in `ingest_batches` is skipped and reported as such. Raw files are only
read, never moved or deleted.

This module moves bytes and rows; it decides nothing about a line's validity.
"""
from __future__ import annotations

import contextlib
import hashlib
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from prefect import task

from storage.config_file import lake_settings
from storage.lake import StagedRows, append_rows, open_lake, transaction
from storage.objects import ObjectStore, parse_s3_uri
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.ingest_features import LOG_ONLY, feature_sql
from tasks.ingest_lines import read_chunks
from tasks.ingest_progress import ingest_progress
from tasks.ingest_scan import clean_features_sql, scan_lines, slow_lines
from tasks.ingest_sources import local_version, object_version
from tasks.log_checks import LogRules, explain, first_failures, known_verdicts


@dataclass(frozen=True)
class IngestConfig:
    rules: LogRules = field(default_factory=LogRules)
    chunk_lines: int = 100_000
    """Lines validated and written per step at most; `chunk_bytes` bounds memory. Each
    step writes one Parquet file per table, so fewer, larger steps make fewer files."""
    chunk_bytes: int = 32 << 20
    """Bytes of the file read per step (more only for a single longer line). A step
    holds ~4x this (lines, derived rows, Parquet writer); 1M lines peak ~0.75-0.8 GB."""
    progress_min_bytes: int = 2_000_000
    """Show a progress bar for files larger than this (a few thousand lines)."""
    defer_lines: int = 1_000
    """Once some verdicts are known (an earlier chunk, or an earlier batch of this process),
    up to this many lines per chunk whose feature rows are new (the odd broken line)
    wait for one GX call at the batch's end instead of costing their chunk one
    (~0.25 s each); more than this and the chunk calls GX itself."""
    commit_attempts: int = 5
    """Tries per batch when a concurrent writer's commit conflicts with ours."""

    def __post_init__(self) -> None:
        if not 1_000 <= self.chunk_lines <= 1_000_000:
            raise ValueError(f"chunk_lines must be within 1,000..1,000,000, got {self.chunk_lines}")
        if not 1 << 20 <= self.chunk_bytes <= 1 << 30:
            raise ValueError(f"chunk_bytes must be within 1 MiB..1 GiB, got {self.chunk_bytes}")
        if self.defer_lines < 0:
            raise ValueError(f"defer_lines must be >= 0, got {self.defer_lines}")


@dataclass(frozen=True)
class BatchResult:
    batch_id: str
    source_uri: str
    rows_ok: int
    rows_quarantined: int
    skipped: bool
    """True when this exact file was ingested before; nothing was written."""
    seconds: float

    @classmethod
    def unchanged(cls, source_uri: str, batch_id: str) -> BatchResult:
        """A file skipped because it was ingested before at its current version."""
        return cls(batch_id, source_uri, 0, 0, True, 0.0)


def ingest_source(con: duckdb.DuckDBPyConnection, settings: LakeSettings, uri: str,
                  cfg: IngestConfig, cycle_id: str) -> BatchResult:
    """Ingest one file (local path or s3:// URI) as one batch."""
    if uri.startswith("s3://"):
        with tempfile.TemporaryDirectory(dir=settings.home) as tmp:
            bucket, key = parse_s3_uri(uri)
            store = ObjectStore(settings)
            # Stat, then download: an object replaced in between is recorded at its old
            # version, so the next scan looks at it again (never the other way round).
            version = object_version(store.stat(bucket, key))
            local = store.download(bucket, key, Path(tmp) / "batch")
            return ingest_file(con, local, uri, cfg, cycle_id, source_version=version)
    return ingest_file(con, Path(uri), uri, cfg, cycle_id)


def ingest_file(con: duckdb.DuckDBPyConnection, path: Path, source_uri: str,
                cfg: IngestConfig, cycle_id: str, *, source_version: str | None = None) -> BatchResult:
    """Ingest `path` as one batch; `source_version` (default: the local file's, taken
    before it is read) is recorded so an unchanged file is not read again."""
    started = time.perf_counter()
    source_version = source_version or local_version(path)
    batch_id = file_sha256(path)
    # Several writers on a PostgreSQL catalog can conflict at commit; the rolled-back
    # batch is simply redone (after re-checking that nobody else committed it).
    for attempt in range(cfg.commit_attempts):
        if con.execute("SELECT count(*) FROM lake.ingest_batches WHERE batch_id = ?", [batch_id]).fetchone()[0]:
            return BatchResult(batch_id, source_uri, 0, 0, True, time.perf_counter() - started)
        try:
            ok, bad = _write_batch(con, path, (source_uri, source_version), batch_id, cfg, cycle_id)
            return BatchResult(batch_id, source_uri, ok, bad, False, time.perf_counter() - started)
        except duckdb.TransactionException:
            if attempt + 1 == cfg.commit_attempts:
                raise
            time.sleep(random.uniform(0.05, 0.5) * (attempt + 1))
    raise AssertionError("unreachable")


def _write_batch(con: duckdb.DuckDBPyConnection, path: Path, source: tuple[str, str],
                 batch_id: str, cfg: IngestConfig, cycle_id: str) -> tuple[int, int]:
    (source_uri, source_version), ok, bad = source, 0, 0
    staged = StagedRows(con, f"ingest-{batch_id[:16]}")
    verdicts = known_verdicts(cfg.rules)
    with ingest_progress(path, source_uri, cfg.progress_min_bytes) as advance, batch_tables(con):
        for step, (chunk, consumed) in enumerate(read_chunks(path, cfg.chunk_lines, cfg.chunk_bytes)):
            # With nothing judged yet (a fresh process's first chunk) the chunk is judged
            # whole; after that the odd line of a new shape waits for the batch's end.
            kept, quarantined = ingest_chunk(con, chunk, staged, batch_id, cycle_id, cfg.rules, verdicts,
                                             defer_at_most=cfg.defer_lines if step or verdicts else 0)
            ok, bad = ok + kept, bad + quarantined
            advance(chunk.num_rows, consumed)
            del chunk  # let the next chunk's lines replace this one's in memory, not join them
        kept, quarantined = ingest_deferred(con, staged, batch_id, cycle_id, cfg.rules, verdicts)
        ok, bad = ok + kept, bad + quarantined
    with transaction(con, message=f"ingest batch {batch_id[:16]} from {source_uri}"):
        staged.register()
        append_rows(con, "ingest_batches", pa.Table.from_pylist([{
            "batch_id": batch_id, "source_uri": source_uri, "rows_ok": ok, "rows_quarantined": bad,
            "ingested_at": datetime.now(timezone.utc), "cycle_id": cycle_id, "source_version": source_version}],
            schema=SCHEMAS["ingest_batches"]))
    return ok, bad


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# Scratch tables of one batch, beside the lake: the current chunk's derived rows (a
# view over its scan), the lines it drops or sets aside, and the logs staged so far
# (repeats across chunks are found by a hash join on these instead of re-reading the
# staged Parquet).
_ROWS, _DROP, _SEEN = "temp.main._ingest_rows", "temp.main._ingest_drop", "temp.main._ingest_seen"
_ASIDE, _SLOW = "temp.main._ingest_aside", "temp.main._ingest_slow_rows"
_DEFERRED = "temp.main._ingest_deferred"  # lines of new shapes, judged at the batch's end


@contextlib.contextmanager
def batch_tables(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    # log_id as its 32 raw bytes: half the memory of the hex text for a million-line batch
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_seen (log_id BLOB, line_no BIGINT)")
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_drop (line_no BIGINT)")
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_aside (line_no BIGINT)")
    try:
        yield
    finally:
        con.execute(f"DROP VIEW IF EXISTS {_ROWS}")
        for name in (_DROP, _SEEN, _ASIDE, _SLOW, _DEFERRED):
            con.execute(f"DROP TABLE IF EXISTS {name}")


def ingest_chunk(con: duckdb.DuckDBPyConnection, chunk: pa.Table, staged: StagedRows, batch_id: str,
                 cycle_id: str, rules: LogRules, verdicts: dict[tuple, str | None], *,
                 defer_at_most: int = 0) -> tuple[int, int]:
    """Validate one chunk (line_no, raw, nbytes, utf8_ok) and stage it; (rows kept, rows quarantined).

    The derived rows are a view over the chunk's scan (tasks/ingest_scan.py) plus the
    full feature query's rows for the few lines the scanner left to it; only distinct
    feature rows travel to Python for GX, and DuckDB writes the kept rows' Parquet itself.
    `verdicts` carries GX's verdicts from chunk to chunk and batch to batch. Up to
    `defer_at_most` lines whose feature rows are new are set aside for
    `ingest_deferred` instead of costing this chunk a GX call of their own.
    """
    scanned = scan_lines(chunk, rules)
    # Several record batches let DuckDB scan the chunk on all its threads.
    con.register("_ingest_chunk", pa.Table.from_batches(scanned.to_batches(max_chunksize=8192)))
    con.register("_ingest_slow", slow_lines(scanned))
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _ingest_slow_rows AS {feature_sql(rules, '_ingest_slow')}")
        con.execute(f"""CREATE OR REPLACE TEMP VIEW _ingest_rows AS
            SELECT * FROM ({clean_features_sql(rules, '_ingest_chunk')} UNION ALL BY NAME SELECT * FROM {_SLOW})
            WHERE line_no NOT IN (SELECT line_no FROM {_ASIDE})""")
        bad_lines, deferred = judge_lines(con, rules, verdicts, defer_at_most=defer_at_most)
        if deferred:
            # A literal list (at most defer_lines numbers) is pushed into both scans,
            # so picking the few lines does not evaluate the whole chunk.
            picked = f"line_no IN ({', '.join(map(str, deferred))})"
            aside = f"""SELECT r.*, c.raw FROM (SELECT * FROM {_ROWS} WHERE {picked}) r
                        JOIN (SELECT line_no, raw FROM _ingest_chunk WHERE {picked}) c USING (line_no)"""
            con.execute(f"CREATE TEMP TABLE IF NOT EXISTS _ingest_deferred AS {aside} LIMIT 0")
            con.execute(f"INSERT INTO {_DEFERRED} {aside}")
            _set_lines(con, _ASIDE, deferred)  # now out of the view
        return _stage_judged(con, chunk, chunk.num_rows - len(deferred), bad_lines, staged, batch_id, cycle_id, rules)
    finally:
        con.execute(f"DELETE FROM {_ASIDE}")
        con.unregister("_ingest_chunk")
        con.unregister("_ingest_slow")


def ingest_deferred(con: duckdb.DuckDBPyConnection, staged: StagedRows, batch_id: str, cycle_id: str,
                    rules: LogRules, verdicts: dict[tuple, str | None]) -> tuple[int, int]:
    """Judge and stage the lines `ingest_chunk` set aside, all in one GX call."""
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = '_ingest_deferred'").fetchone()[0]:
        return 0, 0
    lines = con.sql(f"SELECT line_no, raw FROM {_DEFERRED}").to_arrow_table()
    con.execute(f"CREATE OR REPLACE TEMP VIEW _ingest_rows AS SELECT * EXCLUDE (raw) FROM {_DEFERRED}")
    bad_lines, _ = judge_lines(con, rules, verdicts)
    counts = _stage_judged(con, lines, lines.num_rows, bad_lines, staged, batch_id, cycle_id, rules)
    con.execute(f"DROP TABLE {_DEFERRED}")
    return counts


def _stage_judged(con: duckdb.DuckDBPyConnection, lines: pa.Table, n_rows: int, bad_lines: dict[int, str],
                  staged: StagedRows, batch_id: str, cycle_id: str, rules: LogRules) -> tuple[int, int]:
    """Stage the `n_rows` judged rows of _ROWS: valid non-repeats as logs, the rest (raw
    from `lines`) as quarantine."""
    _set_lines(con, _DROP, bad_lines)
    repeats = find_repeats(con)
    _set_lines(con, _DROP, repeats, keep=True)
    kept = f"SELECT * FROM {_ROWS} WHERE line_no NOT IN (SELECT line_no FROM {_DROP})"
    staged.stage_query("failure_logs", f"""
        SELECT log_id, {_literal(batch_id)} AS batch_id, line_no, request_id, ts, model, domain, verifier,
               messages, response, failure_kind, failure_detail, reference, meta, {_literal(cycle_id)} AS cycle_id
        FROM ({kept})""")
    con.execute(f"INSERT INTO {_SEEN} SELECT unhex(log_id), line_no FROM ({kept})")
    con.execute(f"DROP VIEW {_ROWS}")
    quarantined = _quarantine_rows(lines, bad_lines, repeats, batch_id, cycle_id, rules)
    staged.stage("quarantine", quarantined)
    return n_rows - len(bad_lines) - len(repeats), quarantined.num_rows


def judge_lines(con: duckdb.DuckDBPyConnection, rules: LogRules, verdicts: dict[tuple, str | None], *,
                defer_at_most: int = 0) -> tuple[dict[int, str], list[int]]:
    """({line_no: kind} for the lines of _ROWS the GX suite rejects, lines left unjudged).

    Every expectation of the suite is row-wise over the features, so lines with equal
    feature rows share one verdict: GX validates each distinct feature row (tens per
    batch, not tens of thousands of lines) and its verdict applies to all its lines.
    A feature row already judged in this batch (`verdicts`) is not validated again.
    A GX call costs ~0.25 s however few its rows, so when new feature rows cover at
    most `defer_at_most` lines (the odd broken line), those lines are left unjudged.
    """
    groups = con.sql(f"""SELECT * EXCLUDE (line_no), count(*) AS n_lines, list(line_no) AS line_nos
        FROM (SELECT * EXCLUDE ({', '.join(LOG_ONLY)}) FROM {_ROWS}) GROUP BY ALL""").to_arrow_table()
    features = groups.drop_columns(["n_lines", "line_nos"])
    keys = list(zip(*(column.to_pylist() for column in features.columns)))
    unseen = [i for i, key in enumerate(keys) if key not in verdicts]
    line_nos = groups.column("line_nos")
    if unseen and sum(groups.column("n_lines")[i].as_py() for i in unseen) <= defer_at_most:
        return _lines_of(keys, line_nos, verdicts), [n for i in unseen for n in line_nos[i].as_py()]
    if unseen:
        failures = first_failures(features.take(unseen).to_pandas(), rules)
        verdicts.update((keys[i], failures.get(position)) for position, i in enumerate(unseen))
    return _lines_of(keys, line_nos, verdicts), []


def _lines_of(keys: list[tuple], line_nos: pa.ChunkedArray, verdicts: dict[tuple, str | None]) -> dict[int, str]:
    """{line_no: kind} of the groups judged invalid."""
    return {line_no: kind for i, key in enumerate(keys) if (kind := verdicts.get(key))
            for line_no in line_nos[i].as_py()}


def _set_lines(con: duckdb.DuckDBPyConnection, table: str, line_nos, *, keep: bool = False) -> None:
    """Make `table` hold `line_nos` (added to what it holds when `keep`)."""
    if not keep:
        con.execute(f"DELETE FROM {table}")
    if line_nos:  # one list parameter: registering an Arrow table costs ~6 ms a call
        con.execute(f"INSERT INTO {table} SELECT unnest(?::BIGINT[])", [list(line_nos)])


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Valid lines identical to an earlier valid line of this chunk, to one staged from an
# earlier chunk of this batch, or to a log already in the lake.
_REPEATS_SQL = f"""
WITH ids AS MATERIALIZED (SELECT log_id, line_no FROM {_ROWS} WHERE line_no NOT IN (SELECT line_no FROM {_DROP}))
SELECT c.log_id, c.line_no, c.first_line, s.line_no AS seen_line, f.batch_id AS seen_batch, f.line_no AS lake_line
FROM (SELECT log_id, line_no, min(line_no) OVER (PARTITION BY log_id) AS first_line FROM ids) c
LEFT JOIN {_SEEN} s ON s.log_id = unhex(c.log_id)
LEFT JOIN (
  SELECT log_id, any_value(batch_id) AS batch_id, min(line_no) AS line_no FROM lake.failure_logs
  WHERE log_id IN (SELECT log_id FROM ids) GROUP BY log_id) f ON f.log_id = c.log_id
WHERE f.batch_id IS NOT NULL OR s.line_no IS NOT NULL OR c.first_line <> c.line_no
"""


def find_repeats(con: duckdb.DuckDBPyConnection) -> dict[int, str]:
    """{line_no: reason} for valid lines repeating a log already ingested or staged."""
    repeats: dict[int, str] = {}
    for log_id, line_no, first_line, seen_line, seen_batch, lake_line in con.sql(_REPEATS_SQL).fetchall():
        if seen_batch is not None:
            repeats[line_no] = (f"identical to log {log_id[:16]} already ingested "
                                f"(batch {seen_batch[:16]}, line {lake_line})")
        else:
            repeats[line_no] = f"identical to line {seen_line or first_line} of this file"
    return repeats


def _quarantine_rows(chunk: pa.Table, bad_lines: dict[int, str], repeats: dict[int, str],
                     batch_id: str, cycle_id: str, rules: LogRules) -> pa.Table:
    if not bad_lines and not repeats:
        return SCHEMAS["quarantine"].empty_table()
    wanted = pa.array(sorted(set(bad_lines) | set(repeats)), pa.int64())
    lines = chunk.filter(pc.is_in(chunk["line_no"], value_set=wanted))
    rows = []
    for line_no, raw in zip(lines["line_no"].to_pylist(), lines["raw"].to_pylist(), strict=True):
        raw = raw.rstrip("\r\n")  # the chunk keeps each line's ending; the verbatim line has none
        kind = bad_lines.get(line_no, "repeated_log")
        reason = repeats[line_no] if kind == "repeated_log" else explain(kind, raw, rules)
        rows.append({"batch_id": batch_id, "line_no": line_no, "raw": raw, "kind": kind,
                     "reason": reason, "cycle_id": cycle_id})
    return pa.Table.from_pylist(rows, schema=SCHEMAS["quarantine"])


@task(name="ingest-file", retries=2, retry_delay_seconds=[2, 10], task_run_name="ingest {uri}")
def ingest_file_task(uri: str, cfg: IngestConfig, cycle_id: str) -> dict:
    """Prefect wrapper: opens the lake itself so no credentials travel as parameters."""
    settings = lake_settings()
    con = open_lake(settings)
    try:
        return ingest_source(con, settings, uri, cfg, cycle_id).__dict__
    finally:
        con.close()
