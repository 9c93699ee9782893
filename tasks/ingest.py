"""Ingest: landed failure-log files become `failure_logs` rows, bad lines `quarantine` rows.

A file is one batch (`batch_id` = sha256 of its bytes). Files are read in chunks
of `chunk_lines`; each chunk's rows are staged as Parquet and the whole batch
becomes visible in one DuckLake commit, so memory does not grow with the file, a
crash leaves no partial rows, and a rerun ingests the batch exactly once. A batch
already in `ingest_batches` is skipped and reported as such. Raw files are only
read, never moved or deleted.

Validation rules live in tasks/log_checks.py; this module moves bytes and rows.
"""
from __future__ import annotations

import gzip
import hashlib
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prefect import task

from storage.config_file import lake_settings
from storage.lake import StagedRows, append_rows, open_lake, transaction
from storage.objects import ObjectStore, parse_s3_uri
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.ingest_progress import ingest_progress
from tasks.log_checks import LOG_COLUMNS, LogRules, chunk_sql, explain, first_failures

_SUFFIXES = (".jsonl", ".jsonl.gz")


class IngestError(ValueError):
    """A path to ingest cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class IngestConfig:
    rules: LogRules = field(default_factory=LogRules)
    chunk_lines: int = 20_000
    """Lines validated and written per step; bounds memory (1M lines: ~0.9 GB peak at
    20k, ~1 GB at 50k; 10k is 3x slower because each chunk checks every staged one)."""
    progress_min_bytes: int = 2_000_000
    """Show a progress bar for files larger than this (a few thousand lines)."""
    commit_attempts: int = 5
    """Tries per batch when a concurrent writer's commit conflicts with ours."""

    def __post_init__(self) -> None:
        if not 1_000 <= self.chunk_lines <= 1_000_000:
            raise ValueError(f"chunk_lines must be within 1,000..1,000,000, got {self.chunk_lines}")


@dataclass(frozen=True)
class BatchResult:
    batch_id: str
    source_uri: str
    rows_ok: int
    rows_quarantined: int
    skipped: bool
    """True when this exact file was ingested before; nothing was written."""
    seconds: float


def discover_sources(paths: list[str], settings: LakeSettings, *, allow_empty: bool = False) -> list[str]:
    """Expand files, folders and s3:// keys or prefixes into a sorted list of file URIs.

    An s3:// URI naming one object is that object alone (bucket notifications name
    exactly the new files); otherwise it is a prefix. A folder or prefix holding no
    log files is an error unless `allow_empty` (a scheduled ingest finding nothing new).
    """
    found: list[str] = []
    for item in paths:
        if item.startswith("s3://"):
            found += _discover_s3(item, settings, allow_empty)
            continue
        path = Path(item)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(_SUFFIXES))
            if not files and not allow_empty:
                raise IngestError(f"{item}: folder holds no .jsonl or .jsonl.gz files")
            found += [str(p.resolve()) for p in files]
        elif path.is_file():
            found.append(str(path.resolve()))
        else:
            raise IngestError(f"{item}: no such file or folder")
    return found


def _discover_s3(uri: str, settings: LakeSettings, allow_empty: bool) -> list[str]:
    bucket, prefix = parse_s3_uri(uri)
    keys = [o.key for o in ObjectStore(settings).list(bucket, prefix)]
    if prefix in keys:
        return [uri]
    logs = sorted(k for k in keys if k.endswith(_SUFFIXES))
    if not logs and not allow_empty:
        raise IngestError(f"{uri}: no .jsonl or .jsonl.gz objects under this prefix")
    return [f"s3://{bucket}/{key}" for key in logs]


def ingest_source(con: duckdb.DuckDBPyConnection, settings: LakeSettings, uri: str,
                  cfg: IngestConfig, cycle_id: str) -> BatchResult:
    """Ingest one file (local path or s3:// URI) as one batch."""
    if uri.startswith("s3://"):
        with tempfile.TemporaryDirectory(dir=settings.home) as tmp:
            bucket, key = parse_s3_uri(uri)
            local = ObjectStore(settings).download(bucket, key, Path(tmp) / "batch")
            return ingest_file(con, local, uri, cfg, cycle_id)
    return ingest_file(con, Path(uri), uri, cfg, cycle_id)


def ingest_file(con: duckdb.DuckDBPyConnection, path: Path, source_uri: str,
                cfg: IngestConfig, cycle_id: str) -> BatchResult:
    started = time.perf_counter()
    batch_id = file_sha256(path)
    # Several writers on a PostgreSQL catalog can conflict at commit; the rolled-back
    # batch is simply redone (after re-checking that nobody else committed it).
    for attempt in range(cfg.commit_attempts):
        if con.execute("SELECT count(*) FROM lake.ingest_batches WHERE batch_id = ?", [batch_id]).fetchone()[0]:
            return BatchResult(batch_id, source_uri, 0, 0, True, time.perf_counter() - started)
        try:
            ok, bad = _write_batch(con, path, source_uri, batch_id, cfg, cycle_id)
            return BatchResult(batch_id, source_uri, ok, bad, False, time.perf_counter() - started)
        except duckdb.TransactionException:
            if attempt + 1 == cfg.commit_attempts:
                raise
            time.sleep(random.uniform(0.05, 0.5) * (attempt + 1))
    raise AssertionError("unreachable")


def _write_batch(con: duckdb.DuckDBPyConnection, path: Path, source_uri: str,
                 batch_id: str, cfg: IngestConfig, cycle_id: str) -> tuple[int, int]:
    ok = bad = 0
    staged = StagedRows(con, f"ingest-{batch_id[:16]}")
    with ingest_progress(path, source_uri, cfg.progress_min_bytes) as advance:
        for chunk, consumed in read_chunks(path, cfg.chunk_lines):
            logs, quarantined = validate_chunk(con, chunk, batch_id, cycle_id, cfg.rules,
                                               staged.files.get("failure_logs", []))
            staged.stage("failure_logs", logs)
            staged.stage("quarantine", quarantined)
            ok, bad = ok + logs.num_rows, bad + quarantined.num_rows
            advance(chunk.num_rows, consumed)
    with transaction(con, message=f"ingest batch {batch_id[:16]} from {source_uri}"):
        staged.register()
        append_rows(con, "ingest_batches", pa.Table.from_pylist([{
            "batch_id": batch_id, "source_uri": source_uri, "rows_ok": ok, "rows_quarantined": bad,
            "ingested_at": datetime.now(timezone.utc), "cycle_id": cycle_id}], schema=SCHEMAS["ingest_batches"]))
    return ok, bad


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_chunks(path: Path, chunk_lines: int) -> Iterator[tuple[pa.Table, int]]:
    """(table of line_no, raw; bytes read so far) for up to chunk_lines non-blank lines.

    Undecodable UTF-8 becomes a visible U+FFFD in the stored raw line (flagged in
    `utf8_ok`, so validation quarantines it) instead of aborting the batch.
    """
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
        numbers: list[int] = []
        lines: list[bytes] = []
        consumed = 0
        for line_no, line in enumerate(handle, start=1):
            consumed += len(line)
            line = line.rstrip(b"\r\n")
            if not line or line.isspace():
                continue  # blank lines separate records; they are not records
            numbers.append(line_no)
            lines.append(line)
            if len(lines) == chunk_lines:
                yield _chunk(numbers, lines), consumed
                numbers, lines = [], []
        if lines:
            yield _chunk(numbers, lines), consumed


def _chunk(numbers: list[int], lines: list[bytes]) -> pa.Table:
    raw = pa.array(lines, pa.binary())
    try:
        text, utf8_ok = raw.cast(pa.string()), pa.array(np.ones(len(lines), dtype=bool))  # C++ check
    except pa.ArrowInvalid:
        text = pa.array([line.decode("utf-8", errors="replace") for line in lines], pa.string())
        utf8_ok = pa.array([_is_utf8(line) for line in lines], pa.bool_())
    return pa.table({"line_no": pa.array(numbers, pa.int64()), "raw": text, "utf8_ok": utf8_ok})


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def validate_chunk(con: duckdb.DuckDBPyConnection, chunk: pa.Table, batch_id: str, cycle_id: str,
                   rules: LogRules, earlier: list[str]) -> tuple[pa.Table, pa.Table]:
    """(failure_logs rows, quarantine rows) of one chunk; `earlier` = this batch's staged logs."""
    # Several record batches let DuckDB scan the chunk on all its threads.
    con.register("_ingest_chunk", pa.Table.from_batches(chunk.to_batches(max_chunksize=8192)))
    try:
        parsed = con.sql(chunk_sql(rules, "_ingest_chunk")).to_arrow_table()
    finally:
        con.unregister("_ingest_chunk")
    failures = first_failures(parsed.drop_columns(_LOG_ONLY).to_pandas(), rules)
    line_nos = parsed.column("line_no").to_numpy()
    bad_lines = {int(line_nos[i]): kind for i, kind in failures.items()}
    good = np.ones(parsed.num_rows, dtype=bool)
    good[list(failures)] = False
    logs = parsed.filter(pa.array(good))
    repeats = find_repeats(con, logs.select(["log_id", "line_no"]), earlier)
    if repeats:
        logs = logs.filter(pc.invert(pc.is_in(logs["line_no"], value_set=pa.array(list(repeats), pa.int64()))))
    logs = (logs.append_column("batch_id", pa.array([batch_id] * logs.num_rows, pa.string()))
                .append_column("cycle_id", pa.array([cycle_id] * logs.num_rows, pa.string())))
    quarantined = _quarantine_rows(chunk, bad_lines, repeats, batch_id, cycle_id, rules)
    return logs.select(SCHEMAS["failure_logs"].names).cast(SCHEMAS["failure_logs"]), quarantined


# GX sees every column of chunk_sql except these, which only feed failure_logs.
_LOG_ONLY = [c for c in LOG_COLUMNS if c not in ("domain", "verifier")]

# Lines identical to an earlier line of this chunk, to one staged from an earlier
# chunk of this batch, or to a log already in the lake.
_REPEATS_SQL = """
SELECT c.log_id, c.line_no, min(c.line_no) OVER (PARTITION BY c.log_id) AS first_line,
       f.batch_id AS seen_batch, f.line_no AS seen_line
FROM _ingest_ids c LEFT JOIN (
  SELECT log_id, any_value(batch_id) AS batch_id, min(line_no) AS line_no FROM ({known})
  WHERE log_id IN (SELECT log_id FROM _ingest_ids) GROUP BY log_id) f USING (log_id)
"""


def find_repeats(con: duckdb.DuckDBPyConnection, ids: pa.Table, earlier: list[str]) -> dict[int, str]:
    known = "SELECT log_id, batch_id, line_no FROM lake.failure_logs"
    if earlier:
        files = ", ".join("'" + f.replace("'", "''") + "'" for f in earlier)
        known += f" UNION ALL SELECT log_id, batch_id, line_no FROM read_parquet([{files}])"
    con.register("_ingest_ids", ids)
    try:
        return _split_repeats(con.sql(_REPEATS_SQL.format(known=known)).to_arrow_table())
    finally:
        con.unregister("_ingest_ids")


def _split_repeats(logs: pa.Table) -> dict[int, str]:
    """{line_no: reason} for lines repeating a log already ingested."""
    repeats: dict[int, str] = {}
    flagged = pc.or_(pc.is_valid(logs["seen_batch"]), pc.not_equal(logs["first_line"], logs["line_no"]))
    suspects = logs.filter(flagged).select(["log_id", "line_no", "first_line", "seen_batch", "seen_line"])
    for row in suspects.to_pylist():
        if row["seen_batch"] is not None:
            repeats[row["line_no"]] = (f"identical to log {row['log_id'][:16]} already ingested "
                                       f"(batch {row['seen_batch'][:16]}, line {row['seen_line']})")
        elif row["first_line"] != row["line_no"]:
            repeats[row["line_no"]] = f"identical to line {row['first_line']} of this file"
    return repeats


def _quarantine_rows(chunk: pa.Table, bad_lines: dict[int, str], repeats: dict[int, str],
                     batch_id: str, cycle_id: str, rules: LogRules) -> pa.Table:
    if not bad_lines and not repeats:
        return SCHEMAS["quarantine"].empty_table()
    wanted = set(bad_lines) | set(repeats)
    rows = []
    for line_no, raw in zip(chunk.column("line_no").to_pylist(), chunk.column("raw").to_pylist(), strict=True):
        if line_no not in wanted:
            continue
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


@task(name="discover-landing", retries=2, retry_delay_seconds=[2, 10])
def discover_task(paths: list[str]) -> list[str]:
    return discover_sources(paths, lake_settings(), allow_empty=True)
