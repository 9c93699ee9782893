"""`flywheel sql "SELECT ..."`: query the lake read-only, as a table, CSV or JSON."""
from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterator
from enum import Enum
from typing import Annotated

import duckdb
import typer
from rich.table import Table

from flows.cli.show import cell, print_error, rich_console
from storage.config_file import ConfigError, lake_settings
from storage.lake import LakeError
from storage.query import ReadOnlyViolation, query_batches


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def sql_command(
    query: Annotated[str, typer.Argument(help="One read-only SQL statement; tables live in `lake`.")],
    format: Annotated[OutputFormat, typer.Option("--format", "-f", help="table, csv or json (one object per line)")] = OutputFormat.table,
    snapshot: Annotated[int | None, typer.Option(min=0, help="Read the lake as of this DuckLake snapshot id.")] = None,
    max_rows: Annotated[int, typer.Option(min=1, help="Rows shown by --format table (csv/json print all).")] = 100,
) -> None:
    """Run SQL over the lake. Writes (DROP, DELETE, INSERT, ...) are refused."""
    try:
        with query_batches(lake_settings(), query, snapshot=snapshot) as (names, batches):
            if format is OutputFormat.csv:
                write_csv(names, batches)
            elif format is OutputFormat.json:
                write_json_lines(names, batches)
            else:
                rows, total = [], 0
                for batch in batches:  # the rest counted, not kept
                    rows += batch[:max_rows - len(rows)]
                    total += len(batch)
                print_table(names, rows, total)
    except (ReadOnlyViolation, LakeError, ConfigError) as exc:  # their own words: no "query failed" before them
        raise _fail(str(exc)) from None
    except duckdb.Error as exc:
        raise _fail(f"query failed: {exc}") from None


def write_csv(names: list[str], batches: Iterator[list[tuple]]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")  # a shell line: `$(flywheel sql ... | tail -1)` has no \r
    writer.writerow(names)
    for batch in batches:
        writer.writerows([tuple(_text(v) if isinstance(v, bytes) else v for v in row) for row in batch])


def write_json_lines(names: list[str], batches: Iterator[list[tuple]]) -> None:
    """One object per row; a name the result repeats gets DuckDB's suffix (`x`, `x_1`) so no
    column is lost, a non-finite float is null (JSON has no NaN), a blob its text form."""
    keys = _unique(names)
    for batch in batches:
        sys.stdout.writelines(json.dumps(dict(zip(keys, map(_json_value, row))), default=str) + "\n"
                              for row in batch)


def print_table(names: list[str], rows: list[tuple], total: int) -> None:
    table = Table(show_lines=False)
    for name in names:
        table.add_column(cell(name), overflow="fold")
    for row in rows:
        table.add_row(*(cell(_cell_text(v)) for v in row))
    out = rich_console()
    out.print(table)
    if total > len(rows):
        out.print(f"({total} rows, {len(rows)} shown; --max-rows or --format csv for all)")


def _cell_text(value: object) -> str:
    if value is None:
        return "NULL"
    text = _text(value) if isinstance(value, bytes) else str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _text(blob: bytes) -> str:
    """A blob as DuckDB writes it as text: printable ASCII as is, other bytes as \\xHH."""
    return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in blob)


def _json_value(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes):
        return _text(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


def _unique(names: list[str]) -> list[str]:
    keys: list[str] = []
    for name in names:
        key, n = name, 0
        while key in keys or (key != name and key in names):
            n += 1
            key = f"{name}_{n}"
        keys.append(key)
    return keys


def _fail(message: str) -> typer.Exit:
    print_error(rich_console(stderr=True), message)
    return typer.Exit(code=2)
