"""Read-only SQL sessions over the lake, for people and reports.

Only statements that read are accepted (SELECT, DESCRIBE, SHOW, EXPLAIN, and
table functions such as ducklake_snapshots); the catalog is also attached
READ_ONLY, so a write that slipped past the first check is still refused by DuckDB.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import duckdb

from storage.lake import open_lake
from storage.settings import LakeSettings

if TYPE_CHECKING:  # `flywheel sql` never imports pyarrow (and numpy): a fifth of its start-up
    import pyarrow as pa

# DESCRIBE, SHOW, SUMMARIZE, PRAGMA and FROM-first queries all parse as SELECT.
_READ_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


class ReadOnlyViolation(ValueError):
    """A statement that would change the lake was sent to a read-only session."""


def run_query(settings: LakeSettings, sql: str, *, snapshot: int | None = None) -> pa.Table:
    """Run one read-only statement and return its rows as Arrow (for polars and reports)."""
    with _read_only(settings, sql, snapshot) as con:
        return con.sql(sql).to_arrow_table()


def query_rows(settings: LakeSettings, sql: str, *, snapshot: int | None = None,
               limit: int | None = None) -> tuple[list[str], list[tuple], int]:
    """Run one read-only statement: (column names, its first `limit` rows as Python tuples,
    how many rows it returned): what a terminal prints, without Arrow."""
    with _read_only(settings, sql, snapshot) as con:
        result = con.execute(sql)
        names = [column[0] for column in result.description]
        if limit is None:
            rows = result.fetchall()
            return names, rows, len(rows)
        rows = result.fetchmany(limit)
        total = len(rows)
        while chunk := result.fetchmany(10_000):  # counted, not kept
            total += len(chunk)
        return names, rows, total


@contextlib.contextmanager
def _read_only(settings: LakeSettings, sql: str, snapshot: int | None) -> Iterator[duckdb.DuckDBPyConnection]:
    con = open_lake(settings, read_only=True, snapshot=snapshot)
    try:
        statements = con.extract_statements(sql)
        if len(statements) != 1:
            raise ReadOnlyViolation(f"expected exactly one SQL statement, got {len(statements)}")
        check_read_only(statements[0])
        yield con
    finally:
        con.close()


def check_read_only(statement: duckdb.Statement) -> None:
    kind = statement.type
    if kind not in _READ_STATEMENTS:
        verb = kind.name.replace("_", " ")
        raise ReadOnlyViolation(
            f"flywheel sql is read-only: {verb} statements are refused. The lake changes only "
            "through flywheel's stages (ingest, curate, ...), so every row keeps its lineage.")
