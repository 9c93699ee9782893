"""Read-only SQL sessions over the lake, for people and reports.

Only statements that read are accepted (SELECT, DESCRIBE, SHOW, EXPLAIN, and
table functions such as ducklake_snapshots); the catalog is also attached
READ_ONLY, so a write that slipped past the first check is still refused by DuckDB.
That is not enough for DuckLake's maintenance functions, which a SELECT can call:
`ducklake_cleanup_old_files` deleted Parquet files before the read-only catalog refused
its commit. So every function a statement calls is read from DuckDB's own parse tree,
and only DuckLake's reading functions pass (`flywheel lake maintain` runs the others,
with their grace periods).
"""
from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import duckdb

from storage.lake import open_lake, quote_literal
from storage.settings import LakeSettings

if TYPE_CHECKING:  # `flywheel sql` never imports pyarrow (and numpy): a fifth of its start-up
    import pyarrow as pa

# DESCRIBE, SHOW, SUMMARIZE, PRAGMA and FROM-first queries all parse as SELECT.
_READ_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


# DuckLake's table functions that only read. Any other `ducklake_*` function is refused,
# a new one too: they add, merge, rewrite, expire or delete files, or set options.
_READING_DUCKLAKE = frozenset({
    "ducklake_current_snapshot", "ducklake_last_committed_snapshot", "ducklake_list_files", "ducklake_options",
    "ducklake_scan", "ducklake_settings", "ducklake_snapshots", "ducklake_table_changes",
    "ducklake_table_deletions", "ducklake_table_info", "ducklake_table_insertions"})
_EXPLAIN = re.compile(r"^\s*explain\s+(analy[sz]e\s+)?", re.IGNORECASE)


class ReadOnlyViolation(ValueError):
    """A statement that would change the lake was sent to a read-only session."""


def run_query(settings: LakeSettings, sql: str, *, snapshot: int | None = None) -> pa.Table:
    """Run one read-only statement and return its rows as Arrow (for polars and reports)."""
    with _read_only(settings, sql, snapshot) as con:
        return con.sql(sql).to_arrow_table()


@contextlib.contextmanager
def query_batches(settings: LakeSettings, sql: str, *, snapshot: int | None = None,
                  batch_rows: int = 10_000) -> Iterator[tuple[list[str], Iterator[list[tuple]]]]:
    """Run one read-only statement: (column names, its rows in batches of Python tuples):
    what a terminal prints or exports, without Arrow and never the whole result at once
    (an export of millions of rows holds one batch)."""
    with _read_only(settings, sql, snapshot) as con:
        result = con.execute(sql)
        names = [column[0] for column in result.description]
        yield names, iter(lambda: result.fetchmany(batch_rows), [])


@contextlib.contextmanager
def _read_only(settings: LakeSettings, sql: str, snapshot: int | None) -> Iterator[duckdb.DuckDBPyConnection]:
    con = open_lake(settings, read_only=True, snapshot=snapshot)
    try:
        statements = con.extract_statements(sql)
        if len(statements) != 1:
            raise ReadOnlyViolation(f"expected exactly one SQL statement, got {len(statements)}")
        check_read_only(statements[0])
        check_functions(con, statements[0])
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


def check_functions(con: duckdb.DuckDBPyConnection, statement: duckdb.Statement) -> None:
    """Refuse a statement that calls a function which changes the lake's files, or runs SQL
    given as a string (`query()`), which no check can read."""
    for name in sorted(functions_called(con, statement)):
        if name == "query":
            raise ReadOnlyViolation("flywheel sql is read-only and does not run query(): its SQL is a string "
                                    "no check can read; write the statement itself")
        if name.startswith("ducklake_") and name not in _READING_DUCKLAKE:
            raise ReadOnlyViolation(f"flywheel sql is read-only: {name}() changes the lake's files or catalog; "
                                    "`flywheel lake maintain` runs DuckLake's maintenance, with its grace periods")


def functions_called(con: duckdb.DuckDBPyConnection, statement: duckdb.Statement) -> set[str]:
    """The functions a statement names, lowercase: from DuckDB's parse tree (of the query an
    EXPLAIN explains, which ANALYZE runs), or for statements it cannot serialise (PRAGMA)
    the words before a "("."""
    text = _EXPLAIN.sub("", statement.query)
    # a literal, not a `?` parameter: binding one imports pandas (storage/lake.py says more)
    tree = json.loads(con.execute(f"SELECT json_serialize_sql('{quote_literal(text)}')").fetchone()[0])
    if tree.get("error"):
        return {name.lower() for name in re.findall(r'(\w+)"?\s*\(', text)}
    names: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("function_name"), str):
                names.add(node["function_name"].lower())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names
