"""Read-only SQL sessions over the lake, for people and reports.

Only statements that read are accepted (SELECT, DESCRIBE, SHOW, EXPLAIN, and
table functions such as ducklake_snapshots); the catalog is also attached
READ_ONLY, so a write that slipped past the first check is still refused by DuckDB.
"""
from __future__ import annotations

import duckdb
import pyarrow as pa

from storage.lake import open_lake
from storage.settings import LakeSettings

# DESCRIBE, SHOW, SUMMARIZE, PRAGMA and FROM-first queries all parse as SELECT.
_READ_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


class ReadOnlyViolation(ValueError):
    """A statement that would change the lake was sent to a read-only session."""


def run_query(settings: LakeSettings, sql: str, *, snapshot: int | None = None) -> pa.Table:
    """Run one read-only statement and return its rows."""
    con = open_lake(settings, read_only=True, snapshot=snapshot)
    try:
        statements = con.extract_statements(sql)
        if len(statements) != 1:
            raise ReadOnlyViolation(f"expected exactly one SQL statement, got {len(statements)}")
        check_read_only(statements[0])
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()


def check_read_only(statement: duckdb.Statement) -> None:
    kind = statement.type
    if kind not in _READ_STATEMENTS:
        verb = kind.name.replace("_", " ")
        raise ReadOnlyViolation(
            f"flywheel sql is read-only: {verb} statements are refused. The lake changes only "
            "through flywheel's stages (ingest, curate, ...), so every row keeps its lineage.")
