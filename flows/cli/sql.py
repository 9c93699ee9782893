"""`flywheel sql "SELECT ..."`: query the lake read-only, as a table, CSV or JSON."""
from __future__ import annotations

import csv
import json
import sys
from enum import Enum
from typing import Annotated

import duckdb
import typer
from rich.console import Console
from rich.table import Table

from storage.config_file import lake_settings
from storage.lake import LakeError
from storage.query import ReadOnlyViolation, query_rows


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def sql_command(
    query: Annotated[str, typer.Argument(help="One read-only SQL statement; tables live in `lake`.")],
    format: Annotated[OutputFormat, typer.Option("--format", "-f", help="table, csv or json (one object per line)")] = OutputFormat.table,
    snapshot: Annotated[int | None, typer.Option(help="Read the lake as of this DuckLake snapshot id.")] = None,
    max_rows: Annotated[int, typer.Option(min=1, help="Rows shown by --format table (csv/json print all).")] = 100,
) -> None:
    """Run SQL over the lake. Writes (DROP, DELETE, INSERT, ...) are refused."""
    try:
        limit = max_rows if format is OutputFormat.table else None
        names, rows, total = query_rows(lake_settings(), query, snapshot=snapshot, limit=limit)
    except (ReadOnlyViolation, LakeError) as exc:  # the lake's own words: no "query failed" before them
        raise _fail(str(exc)) from None
    except duckdb.Error as exc:
        raise _fail(f"query failed: {exc}") from None
    if format is OutputFormat.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(names)
        writer.writerows(rows)
    elif format is OutputFormat.json:
        for row in rows:
            sys.stdout.write(json.dumps(dict(zip(names, row)), default=str) + "\n")
    else:
        print_table(names, rows, total)


def print_table(names: list[str], rows: list[tuple], total: int) -> None:
    table = Table(show_lines=False)
    for name in names:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    console = Console()
    console.print(table)
    if total > len(rows):
        console.print(f"({total} rows, {len(rows)} shown; --max-rows or --format csv for all)")


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {message}")
    return typer.Exit(code=2)
