"""`flywheel ingest PATH...`: run the ingest flow and print one line per batch."""
from __future__ import annotations

import os
from typing import Annotated

import typer

from flows.cli.show import plain, print_error, rich_console
from storage.config_file import ConfigError, lake_settings


def ingest_command(
    paths: Annotated[list[str], typer.Argument(help="Files (.jsonl, .jsonl.gz), folders, or s3://bucket/prefix URIs.")],
    cycle_id: Annotated[str, typer.Option(help="Recorded on every row written.")] = "manual",
    chunk_lines: Annotated[int | None, typer.Option(
        help="Lines validated and written per step; default: \\[cycle.ingest] chunk_lines.")] = None,
) -> None:
    """Validate failure logs and land them in the lake; bad lines go to quarantine."""
    from storage.objects import ObjectStoreError
    from tasks.cycle.config import cycle_config
    from tasks.ingest.sources import IngestError, discover_sources

    console = rich_console()
    try:
        cycle_config()  # a bad flywheel.toml fails here, before Prefect starts
        discover_sources(paths, lake_settings())
    except (IngestError, ObjectStoreError, ConfigError) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.ingest import ingest_flow

    results = ingest_flow(paths, cycle_id=cycle_id, chunk_lines=chunk_lines)
    for r in results:
        if r["skipped"]:
            console.print(f"[yellow]already ingested[/yellow] {plain(r['source_uri'])} (batch {r['batch_id'][:12]}): nothing written")
        else:
            grown = f", the lines it gained from line {r['first_line']:,}" if r.get("first_line", 1) > 1 else ""
            console.print(f"[green]ingested[/green] {plain(r['source_uri'])} (batch {r['batch_id'][:12]}{grown}): "
                          f"{r['rows_ok']:,} rows, {r['rows_quarantined']:,} quarantined, {r['seconds']:.1f}s")
