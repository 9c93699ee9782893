"""`flywheel sql "SELECT ..."`: query the lake read-only, as a table, CSV or JSON."""
from __future__ import annotations

import csv
import json
import sys
from enum import Enum
from typing import Annotated

import duckdb
import pyarrow as pa
import typer
from rich.console import Console
from rich.table import Table

from storage.config_file import lake_settings
from storage.lake import LakeError
from storage.query import ReadOnlyViolation, run_query


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def sql_command(
    query: Annotated[str, typer.Argument(help="One read-only SQL statement; tables live in `lake`.")],
    format: Annotated[OutputFormat, typer.Option("--format", "-f", help="table, csv or json (one object per line)")] = OutputFormat.table,
    snapshot: Annotated[int | None, typer.Option(help="Read the lake as of this DuckLake snapshot id.")] = None,
    max_rows: Annotated[int, typer.Option(help="Rows shown by --format table (csv/json print all).")] = 100,
) -> None:
    """Run SQL over the lake. Writes (DROP, DELETE, INSERT, ...) are refused."""
    try:
        rows = run_query(lake_settings(), query, snapshot=snapshot)
    except ReadOnlyViolation as exc:
        raise _fail(str(exc)) from None
    except (duckdb.Error, LakeError) as exc:
        raise _fail(f"query failed: {exc}") from None
    if format is OutputFormat.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(rows.column_names)
        writer.writerows(zip(*(col.to_pylist() for col in rows.columns)))
    elif format is OutputFormat.json:
        for record in rows.to_pylist():
            sys.stdout.write(json.dumps(record, default=str) + "\n")
    else:
        print_table(rows, max_rows=max_rows)


def print_table(rows: pa.Table, *, max_rows: int = 100, title: str | None = None) -> None:
    table = Table(title=title, show_lines=False)
    for name in rows.column_names:
        table.add_column(name, overflow="fold")
    for record in rows.slice(0, max_rows).to_pylist():
        table.add_row(*(_cell(v) for v in record.values()))
    console = Console()
    console.print(table)
    if rows.num_rows > max_rows:
        console.print(f"({rows.num_rows} rows, {max_rows} shown; --max-rows or --format csv for all)")


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {message}")
    return typer.Exit(code=2)
