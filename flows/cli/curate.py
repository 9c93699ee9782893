"""`flywheel curate`: decide every undecided failure log (task, or the reason it is not)."""
from __future__ import annotations

from typing import Annotated

import duckdb
import typer

from flows.cli.show import print_error, rich_console
from storage.config_file import ConfigError, lake_settings
from storage.lake import LakeError, open_lake


def curate_command(
    cycle_id: Annotated[str, typer.Option(help="Recorded on every row written.")] = "manual",
) -> None:
    """Dedup, decontaminate and self-test new failure logs; write tasks and decisions."""
    from tasks.curate.coverage import covered_item_count
    from tasks.curate.curation import curate
    from tasks.cycle.config import cycle_config

    console = rich_console()
    try:
        cfg = cycle_config().curate
        with open_lake(lake_settings()) as con:
            counts = curate(con, cfg, cycle_id)
            covered = covered_item_count(con)
    except (ConfigError, LakeError, duckdb.Error) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    console.print(f"curated {counts.logs:,} logs in {counts.seconds:.1f}s: kept {counts.kept:,} · "
                  f"duplicate {counts.duplicate:,} · near duplicate {counts.near_duplicate:,} · "
                  f"contaminated {counts.contaminated:,} · unverifiable {counts.unverifiable:,}")
    if covered:
        console.print(f"[yellow]{covered:,} eval items are covered by tasks in the lake[/yellow] "
                      f"({counts.coverage_rows:,} new rows): flywheel sql \"SELECT * FROM eval_coverage\"")
    console.print("why: flywheel sql \"SELECT decision, evidence FROM decisions WHERE log_id = '...'\"")
