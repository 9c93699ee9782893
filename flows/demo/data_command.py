"""`flywheel demo-data --out DIR --logs N --seed S`: write demo failure logs, eval sets and a manifest."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.show import plain, print_error, rich_console


def demo_data_command(
    out: Annotated[Path, typer.Option("--out", help="Folder to write landing/, evalsets/ and manifest.json into.")],
    logs: Annotated[int, typer.Option("--logs", help="Number of log lines (clean and planted).")] = 3000,
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same bytes.")] = 0,
) -> None:
    """Generate realistic failure logs with duplicates, near duplicates, eval leaks and bad lines planted."""
    from flows.demo.data.generate import DemoDataConfig, generate_demo_data

    try:
        config = DemoDataConfig(logs=logs, seed=seed)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    console = rich_console()
    started = time.perf_counter()
    try:
        manifest = generate_demo_data(out, config)
    except OSError as exc:  # --out somewhere nothing can be written (a file, no permission, a full disk)
        print_error(console, f"--out {out}: {exc}")
        raise typer.Exit(2) from None
    seconds = time.perf_counter() - started
    console.print(f"wrote {manifest.logs:,} log lines in {len(manifest.files)} files under {plain(out / 'landing')} "
                  f"({manifest.logs / seconds:,.0f} lines/s)")
    console.print(f"  clean {len(manifest.clean):,} · exact duplicates {len(manifest.exact_duplicates):,} · "
                  f"near duplicates {len(manifest.near_duplicates):,} · eval leaks {len(manifest.eval_leaks):,} · "
                  f"malformed {len(manifest.malformed):,}")
    console.print(f"  eval sets in {plain(out / 'evalsets')}, manifest {plain(out / 'manifest.json')}")
