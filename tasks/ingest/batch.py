"""Ingest: landed failure-log files become `failure_logs` rows, bad lines `quarantine` rows.

A file is one batch (`batch_id` = sha256 of its bytes). Files are read in chunks
(tasks/ingest/lines.py) and scanned (tasks/ingest/scan.py: a native pass for clean
lines, DuckDB's feature query, tasks/ingest/features.py, for the rest); the Great
Expectations suite (tasks/ingest/checks.py) decides which lines are valid, and the
valid rows are staged as Parquet (tasks/ingest/chunks.py). The whole
batch becomes visible in one DuckLake commit, so memory does not grow with the file,
a crash leaves no partial rows, and a rerun ingests the batch exactly once. A batch
already in `ingest_batches` is skipped and reported as such. Raw files are only
read, never moved or deleted. A file the gateway shipped (under `<landing>/gateway/`,
or anywhere when its first line is a gateway record) holds gateway records instead:
tasks/ingest/gateway.py writes them to the lake and hands the failure logs they signal
back to `ingest_file`.

This module moves bytes and rows; it decides nothing about a line's validity.
"""
from __future__ import annotations

import contextlib
import hashlib
import random
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
from prefect import task

from storage.config_file import lake_settings
from storage.lake import StagedRows, append_rows, open_lake, transaction
from storage.objects import ObjectStore, parse_s3_uri
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.ingest.chunks import (SetAside, batch_tables, judge_chunk, judge_set_aside, stage_chunk,
                                stage_set_aside, quarantine_lake_repeats, drop_lake_repeats, stage_cut)
from tasks.ingest.gateway_records import GATEWAY_FOLDER, is_gateway_record
from tasks.ingest.appends import appended_start
from tasks.ingest.lines import Start, first_line, read_chunks
from tasks.ingest.progress import ingest_progress
from tasks.ingest.scan import ScannedChunks
from tasks.ingest.sources import find_sources, local_version, object_version, split_unchanged
from tasks.ingest.checks import LogRules, known_verdicts

if TYPE_CHECKING:
    from tasks.stages import StageKey

_BESIDE = ThreadPoolExecutor(1, thread_name_prefix="ingest-set-aside")


@dataclass(frozen=True)
class IngestConfig:
    rules: LogRules = field(default_factory=LogRules)
    chunk_lines: int = 100_000
    """Lines validated and written per step at most; `chunk_bytes` bounds memory. Each
    step writes one Parquet file per table, so fewer, larger steps make fewer files."""
    chunk_bytes: int = 32 << 20
    """Bytes of the file read per step (more only for a single longer line). Two steps
    are in flight (one read ahead), each holding ~3x this (lines, scanned values,
    Parquet writer); 1M lines of ~850 bytes peak at ~0.8 GB, with 64 MiB steps ~1.0 GB."""
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
    interactions: int = 0
    """A gateway file's calls written to `interactions` (tasks/ingest/gateway.py); for such
    a file `rows_ok` counts the failure logs derived from its records, `rows_quarantined`
    its broken lines and the derived logs ingest refused."""
    feedback: int = 0
    """A gateway file's feedback written to `feedback`."""
    first_line: int = 1
    """The file's first line the batch read: past 1 when the file grew by appends since
    an earlier batch took the lines before it (tasks/ingest/appends.py)."""

    @classmethod
    def unchanged(cls, source_uri: str, batch_id: str) -> BatchResult:
        """A file skipped because it was ingested before at its current version."""
        return cls(batch_id, source_uri, 0, 0, True, 0.0)


def run(con: duckdb.DuckDBPyConnection, cfg: IngestConfig, key: StageKey) -> dict:
    """The ingest stage: each new or changed file under the key's landing paths (default:
    the configured landing) becomes one batch; unchanged files are counted as skipped."""
    settings = lake_settings()
    paths = list(key.landing)
    if not paths:
        paths = [settings.landing_uri]
        if not settings.uses_s3:
            Path(paths[0]).mkdir(parents=True, exist_ok=True)
    pending, unchanged = split_unchanged(con, find_sources(paths, settings, allow_empty=True))
    results = [ingest_source(con, settings, source.uri, cfg, key.cycle_id) for source in pending]
    return {"files": len(results) + len(unchanged), "skipped": sum(r.skipped for r in results) + len(unchanged),
            "rows_ok": sum(r.rows_ok for r in results),
            "rows_quarantined": sum(r.rows_quarantined for r in results),
            "interactions": sum(r.interactions for r in results), "feedback": sum(r.feedback for r in results)}


def ingest_source(con: duckdb.DuckDBPyConnection, settings: LakeSettings, uri: str,
                  cfg: IngestConfig, cycle_id: str) -> BatchResult:
    """Ingest one file (local path or s3:// URI) as one batch: failure logs, or gateway
    records when the gateway shipped it (`is_gateway_source`)."""
    with local_copy(settings, uri) as (path, version):
        if is_gateway_source(settings, uri, path):
            # gateway.py builds on this module (its failure logs go through ingest_file),
            # so it is imported where it is used, not above
            from tasks.ingest.gateway import ingest_gateway_file
            return ingest_gateway_file(con, settings, path, uri, cfg, cycle_id, source_version=version)
        return ingest_file(con, path, uri, cfg, cycle_id, source_version=version)


def is_gateway_source(settings: LakeSettings, uri: str, path: Path) -> bool:
    """Whether `uri` is a file the gateway shipped: under `<landing>/gateway/`, or anywhere
    else when its first line is a gateway record (a shipment copied out of its landing, or
    from another deployment: read as failure logs, every line would be quarantined, and
    its bytes' batch id would keep the file from ever being ingested as what it is)."""
    if uri.startswith(settings.landing_uri.rstrip("/") + "/" + GATEWAY_FOLDER):
        return True
    return is_gateway_record(first_line(path))


@contextlib.contextmanager
def local_copy(settings: LakeSettings, uri: str) -> Iterator[tuple[Path, str | None]]:
    """The file at `uri` on local disk, and its version (None for a local file: ingest
    takes it just before reading)."""
    if not uri.startswith("s3://"):
        yield Path(uri), None
        return
    with tempfile.TemporaryDirectory(dir=settings.home) as tmp:
        bucket, key = parse_s3_uri(uri)
        store = ObjectStore(settings)
        # Stat, then download: an object replaced in between is recorded at its old
        # version, so the next scan looks at it again (never the other way round).
        version = object_version(store.stat(bucket, key))
        yield store.download(bucket, key, Path(tmp) / "batch"), version


def ingest_file(con: duckdb.DuckDBPyConnection, path: Path, source_uri: str,
                cfg: IngestConfig, cycle_id: str, *, source_version: str | None = None) -> BatchResult:
    """Ingest `path` as one batch; `source_version` (default: the local file's, taken
    before it is read) is recorded so an unchanged file is not read again."""
    started = time.perf_counter()
    source_version = source_version or local_version(path)
    # Several writers on a PostgreSQL catalog can conflict at commit; the rolled-back
    # batch is simply redone (after re-checking that nobody else committed it).
    for attempt in range(cfg.commit_attempts):
        # The first chunk is read and scanned while the file is hashed; a batch found
        # already ingested costs that chunk's work and nothing more.
        start, batch_id = appended_start(con, path, source_uri)
        with ScannedChunks(path, cfg.rules, cfg.chunk_lines, cfg.chunk_bytes, start) as chunks:
            batch_id = batch_id or file_sha256(path)
            if con.execute("SELECT count(*) FROM lake.ingest_batches WHERE batch_id = ?", [batch_id]).fetchone()[0]:
                return BatchResult(batch_id, source_uri, 0, 0, True, time.perf_counter() - started)
            try:
                ok, bad = _write_batch(con, chunks, (path, source_uri, source_version, start), batch_id, cfg,
                                       cycle_id)
                return BatchResult(batch_id, source_uri, ok, bad, False, time.perf_counter() - started,
                                   first_line=start.line_no)
            except duckdb.TransactionException:
                if attempt + 1 == cfg.commit_attempts:
                    raise
        time.sleep(random.uniform(0.05, 0.5) * (attempt + 1))
    raise AssertionError("unreachable")


def _write_batch(con: duckdb.DuckDBPyConnection, chunks: ScannedChunks, source: tuple[Path, str, str, Start],
                 batch_id: str, cfg: IngestConfig, cycle_id: str) -> tuple[int, int]:
    path, source_uri, source_version, start = source
    staged = StagedRows(con, f"ingest-{batch_id[:16]}")
    with batch_tables(con):
        ok, bad = _stage_batch(con, chunks, (path, source_uri), staged, batch_id, cfg, cycle_id)
        with transaction(con, message=f"ingest batch {batch_id[:16]} from {source_uri}"):
            reread = lambda: (lines for lines, _ in  # noqa: E731
                              read_chunks(path, cfg.chunk_lines, cfg.chunk_bytes, start))
            repeats = quarantine_lake_repeats(con, staged, reread, batch_id, cycle_id)
            ok, bad = ok - repeats, bad + repeats + (stage_cut(staged, chunks.cut, batch_id, cycle_id)
                                                     if chunks.cut else 0)
            staged.register()
            drop_lake_repeats(con, batch_id)
            append_rows(con, "ingest_batches", pa.Table.from_pylist([{
                "batch_id": batch_id, "source_uri": source_uri, "rows_ok": ok, "rows_quarantined": bad,
                "ingested_at": datetime.now(timezone.utc), "cycle_id": cycle_id, "source_version": source_version,
                "first_line": start.line_no}],
                schema=SCHEMAS["ingest_batches"]))
    return ok, bad


def _stage_batch(con: duckdb.DuckDBPyConnection, chunks: ScannedChunks, source: tuple[Path, str],
                 staged: StagedRows, batch_id: str, cfg: IngestConfig, cycle_id: str) -> tuple[int, int]:
    """Judge and stage every chunk, then the lines set aside; (rows kept, rows quarantined)."""
    ok, bad = 0, 0
    verdicts = known_verdicts(cfg.rules)
    aside, judging_aside = SetAside(limit=0), None
    with ingest_progress(*source, cfg.progress_min_bytes) as advance, con.cursor() as cursor:
        try:
            for step, (chunk, consumed, last) in enumerate(chunks):
                # With nothing judged yet (a fresh process's first chunk) the chunk is judged
                # whole; after that the odd line of a new shape waits for the batch's end.
                aside.limit = cfg.defer_lines if step or verdicts else 0
                judged = judge_chunk(con, chunk, cfg.rules, verdicts, aside)
                if last:  # the set-aside lines' GX call runs while DuckDB stages the last chunk
                    judging_aside = _BESIDE.submit(judge_set_aside, cursor, aside, cfg.rules, verdicts)
                kept, quarantined = stage_chunk(con, judged, staged, batch_id, cycle_id, cfg.rules)
                ok, bad = ok + kept, bad + quarantined
                advance(chunk.num_rows, consumed)
                del chunk, judged  # let the next chunk's lines replace this one's in memory, not join them
            judged_aside = (judging_aside.result() if judging_aside
                            else judge_set_aside(cursor, aside, cfg.rules, verdicts))
        finally:
            if judging_aside:  # the cursor must outlive the query it runs, even when the batch fails
                wait([judging_aside])
    kept, quarantined = stage_set_aside(con, judged_aside, staged, batch_id, cycle_id, cfg.rules, verdicts)
    return ok + kept, bad + quarantined


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:  # one reused buffer, the GIL released while hashing
        return hashlib.file_digest(handle, "sha256").hexdigest()


@task(name="ingest-file", retries=2, retry_delay_seconds=[2, 10], task_run_name="ingest {uri}")
def ingest_file_task(uri: str, cfg: IngestConfig, cycle_id: str) -> dict:
    """Prefect wrapper: opens the lake itself so no credentials travel as parameters."""
    settings = lake_settings()
    con = open_lake(settings)
    try:
        return ingest_source(con, settings, uri, cfg, cycle_id).__dict__
    finally:
        con.close()
