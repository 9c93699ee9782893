"""The ingest flow: landed files -> failure_logs + quarantine, one batch per file; files the
gateway shipped (under `<landing>/gateway/`) -> interactions + feedback + the failure logs
they signal (tasks/ingest/gateway.py; the per-file task routes them)."""
from __future__ import annotations

from prefect import flow

from tasks.cycle.config import cycle_config
from tasks.ingest.batch import BatchResult, ingest_file_task
from tasks.ingest.sources import discover_task


@flow(name="ingest", log_prints=True)
def ingest_flow(paths: list[str], cycle_id: str = "manual", chunk_lines: int | None = None) -> list[dict]:
    """Ingest files, folders or s3:// prefixes; each file commits as one batch.

    Files already ingested at their current version are reported as skipped without
    a task of their own: a scheduled run over a landing prefix that only grows reads
    and downloads only what is new or changed. The rules and sizes are `[cycle.ingest]`
    of flywheel.toml, as for the cycle's ingest; `chunk_lines`, when given, wins.
    """
    cfg = cycle_config({} if chunk_lines is None else {"ingest.chunk_lines": chunk_lines}).ingest
    found = discover_task(paths)
    results = [ingest_file_task(uri, cfg, cycle_id) for uri in found["pending"]]
    unchanged = [BatchResult.unchanged(uri, batch_id).__dict__ for uri, batch_id in found["unchanged"].items()]
    return sorted(results + unchanged, key=lambda r: r["source_uri"])
