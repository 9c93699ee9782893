"""`flywheel evalset add NAME FILE.jsonl` and `flywheel evalset list`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import duckdb
import typer
from rich.table import Table

from flows.cli.show import cell, plain, print_error, rich_console
from storage.config_file import ConfigError, lake_settings
from storage.lake import LakeError, open_lake

evalset_app = typer.Typer(help="Register and list evaluation sets (decontamination compares against them).",
                          no_args_is_help=True)


@evalset_app.command("add")
def add_command(
    name: Annotated[str, typer.Argument(help="Name of the evaluation set, e.g. math.")],
    file: Annotated[Path, typer.Argument(help="JSONL (or .jsonl.gz): one {id, domain, prompt, reference, "
                                              "verifier?} per line, or HumanEval, MBPP or GSM8K as published.",
                                         exists=True, dir_okay=False, readable=True)],
    cycle_id: Annotated[str, typer.Option(help="Recorded on every row written.")] = "manual",
) -> None:
    """Register FILE as the newest version of NAME; the same file twice is a no-op."""
    from tasks.curate.evalsets import EvalsetError, register_evalset
    from tasks.cycle.config import cycle_config

    console = rich_console()
    try:
        verifiers = cycle_config().curate.verifiers  # the domain map curation decontaminates with
        # closed on a refused file too: a later open in the same process (a test, a notebook)
        # otherwise meets the catalog this connection still holds
        with open_lake(lake_settings()) as con:
            result = register_evalset(con, name, file, cycle_id=cycle_id, verifiers=verifiers)
    except (EvalsetError, ConfigError, LakeError, duckdb.Error) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    if result.added:
        console.print(f"[green]registered[/green] {plain(name)} version {result.eval_version[:12]}: {result.items:,} items")
    else:
        console.print(f"[yellow]already registered[/yellow] {plain(name)} version {result.eval_version[:12]} "
                      f"({result.items:,} items): nothing written")


@evalset_app.command("list")
def list_command() -> None:
    """Every registered version of every evaluation set."""
    from tasks.curate.evalsets import list_evalsets

    console = rich_console()
    try:
        with open_lake(lake_settings(), read_only=True) as con:  # a list writes nothing, a lake too
            rows = list_evalsets(con)
    except (ConfigError, LakeError, duckdb.Error) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    table = Table("eval_set", "eval_version", "items", "added_at", "latest")
    for r in rows:
        table.add_row(*map(cell, (r["eval_set"], r["eval_version"][:12], f"{r['items']:,}", r["added_at"],
                                  "yes" if r["latest"] else "")))
    console.print(table if rows else "no evaluation sets registered")
