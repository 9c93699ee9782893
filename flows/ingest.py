"""The ingest flow: landed files -> failure_logs + quarantine, one batch per file."""
from __future__ import annotations

from prefect import flow

from tasks.ingest import IngestConfig, discover_task, ingest_file_task


@flow(name="ingest", log_prints=True)
def ingest_flow(paths: list[str], cycle_id: str = "manual", chunk_lines: int = 20_000) -> list[dict]:
    """Ingest files, folders or s3:// prefixes; each file commits as one batch."""
    cfg = IngestConfig(chunk_lines=chunk_lines)
    return [ingest_file_task(uri, cfg, cycle_id) for uri in discover_task(paths)]
