"""Copy every table of one lake into another, empty one: the tables' half of `flywheel lake move`.

Why a copy through the write path rather than a copy of the catalog: DuckLake's catalog
remembers its DATA_PATH and the absolute paths of staged files (storage.lake:
`_explain_attach_error`), and offers no supported way to carry a catalog's snapshots
from one catalog database (SQLite) to another (PostgreSQL) with its files moved. So the
destination gets today's rows of every table in `storage.schemas`, read at one source
snapshot and written as Parquet under its own data path, checked against each table's
schema (`StagedRows`), and made visible in one DuckLake commit. That commit is the last
thing the move does, so a destination holds all the rows or none: a move killed before
it leaves a destination that a rerun accepts as empty (the staged files keep their
names and are written again; maintenance deletes what a run that is never repeated
left).

What it deliberately does not do: keep history (the destination starts at one snapshot;
`cycles.snapshot_id` and `flywheel sql --snapshot` name the source's snapshots), merge
into a lake that holds rows, move model folders (tasks/release/model_move.py owns where
a model lives; its rewritten `models` rows come in as `replaced`), move files that are
no table (landing files, training jobs, reports), or touch the source.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

from storage.lake import LakeError, StagedRows, current_snapshot, open_lake, transaction
from storage.settings import LakeSettings

if TYPE_CHECKING:
    import pyarrow as pa

# Rows per staged Parquet file: a batch of failure logs this size is ~50 MB in memory.
BATCH_ROWS = 50_000


class MoveRefused(LakeError):
    """A move that must not happen (or go on): the message says why; nothing was written."""


@dataclass(frozen=True)
class TablesMoved:
    rows: dict[str, int]
    """Rows copied per table of storage.schemas (0 for an empty one)."""
    bytes: int
    """Parquet bytes the destination's tables hold after the commit."""
    snapshot: int
    """The destination's snapshot that holds them."""


def describe(settings: LakeSettings) -> str:
    """Where a lake is, for a person; never the catalog DSN, which may hold a password."""
    catalog = "a PostgreSQL catalog" if settings.catalog_dsn else f"catalog {settings.home / 'catalog.sqlite'}"
    where = f"{settings.data_path} on {settings.s3_endpoint}" if settings.uses_s3 else settings.data_path
    return f"{where} ({catalog})"


def check_move(source: LakeSettings, dest: LakeSettings) -> int:
    """The source snapshot a move copies, or MoveRefused saying in one line why it cannot
    start (the same lake twice, a shared home, no source, a destination with rows), with
    nothing written anywhere."""
    same_store = _store(source) == _store(dest)
    if source.catalog_uri == dest.catalog_uri or (same_store and source.data_path == dest.data_path):
        raise MoveRefused(f"source and destination are the same lake ({describe(source)}): name another "
                          "destination in the --to file's [lake] table")
    if same_store and (source.data_path.startswith(dest.data_path) or dest.data_path.startswith(source.data_path)):
        raise MoveRefused(f"the destination's data path {dest.data_path} and the source's {source.data_path} "
                          "hold one another: maintenance of either would delete the other's files")
    if source.home.resolve() == dest.home.resolve():
        # home/models/<version> is where a lake keeps its imported folders, and on a bucket
        # lake maintenance deletes this machine's copies there: one home for two lakes
        # would let the new lake's maintenance delete the old one's models
        raise MoveRefused(f"the destination's [lake] home is the source's ({source.home}): give the destination "
                          "its own home in the --to file (on a bucket lake it holds only this machine's copies)")
    try:
        con = open_lake(source, read_only=True)
    except LakeError as exc:
        raise MoveRefused(f"nothing to move: {exc}") from exc
    try:
        for table in _tables(con):
            _source_columns(con, table)  # a column this flywheel does not know is refused now
        snapshot = current_snapshot(con)
    finally:
        con.close()
    held = _rows_held(dest)
    if held:
        table, count = next(iter(held.items()))
        raise MoveRefused(f"the destination {describe(dest)} already holds a lake with rows ({count:,} in {table}"
                          f"{' and more' if len(held) > 1 else ''}): a move copies into an empty lake and merges "
                          "nothing; if an earlier move finished, it is done (`flywheel sql` on the destination "
                          "shows its rows)")
    return snapshot


def move_tables(src: duckdb.DuckDBPyConnection, source: LakeSettings, dest: LakeSettings,
                replaced: Mapping[str, pa.Table]) -> TablesMoved:
    """Copy every table `src` (the source, opened at the snapshot check_move gave) reads into
    `dest` in one commit; a table named in `replaced` gets those rows instead of the
    source's (the `models` rows whose folders were copied)."""
    from storage.schemas import SCHEMAS

    snapshot = current_snapshot(src)
    con = open_lake(dest)
    try:
        staged = StagedRows(con, "lake-move")
        rows = dict.fromkeys(SCHEMAS, 0)
        known = set(_tables(src))
        for table in SCHEMAS:
            if table in replaced:
                batches = replaced[table].to_batches(BATCH_ROWS)
            else:
                batches = source_rows(src, table) if table in known else iter(())
            for batch in batches:
                staged.stage(table, _table_of(batch))
                rows[table] += batch.num_rows
        with transaction(con, message=f"lake move of snapshot {snapshot} from {describe(source)}"):
            held = _count_rows(con)  # a writer that came in since check_move: still no merge
            if held:
                raise MoveRefused(f"the destination received rows while the move ran ({held}): nothing was "
                                  "committed; stop what writes there, and move into an empty lake")
            staged.register()
        moved_bytes = con.execute("SELECT coalesce(sum(file_size_bytes), 0) FROM ducklake_table_info('lake')"
                                  ).fetchone()[0]
        return TablesMoved(rows, int(moved_bytes), current_snapshot(con))
    finally:
        con.close()


def source_rows(con: duckdb.DuckDBPyConnection, table: str) -> Iterator[pa.RecordBatch]:
    """The rows of lake.`table` in its schema's columns, in batches; a column the lake's
    version of the table lacks (a lake made before the column was added, opened
    read-only, so never brought up to date) comes as nulls."""
    import pyarrow as pa

    from storage.schemas import SCHEMAS

    schema, present = SCHEMAS[table], _source_columns(con, table)
    reader = con.execute(f"SELECT {', '.join(present)} FROM lake.{table}").to_arrow_reader(BATCH_ROWS)
    for batch in reader:
        columns = [batch.column(name) if name in present else pa.nulls(batch.num_rows, field.type)
                   for name, field in zip(schema.names, schema)]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _source_columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    from storage.schemas import SCHEMAS

    columns = [r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = 'lake' AND table_name = ? "
        "ORDER BY column_index", [table]).fetchall()]
    unknown = [c for c in columns if c not in SCHEMAS[table].names]
    if unknown:
        raise MoveRefused(f"the source's {table} has columns this flywheel does not know ({', '.join(unknown)}): "
                          "move it with the flywheel version that wrote it")
    return columns


def _tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The tables of storage.schemas the lake holds (an older lake may lack newer ones)."""
    from storage.schemas import SCHEMAS

    held = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake'")
            .fetchall()}
    return [t for t in SCHEMAS if t in held]


def _rows_held(settings: LakeSettings) -> dict[str, int]:
    """Rows per non-empty table of the lake `settings` name; {} when there is no lake yet."""
    if not settings.catalog_dsn and not (settings.home / "catalog.sqlite").exists():
        return {}
    try:
        con = open_lake(settings, read_only=True)
    except LakeError as exc:
        # DuckLake's word for a PostgreSQL database it has not made a catalog in yet
        if "creating a new DuckLake is explicitly disabled" in str(exc.__cause__):
            return {}
        raise LakeError(f"the destination: {exc}") from exc
    try:
        return _count_rows(con)
    finally:
        con.close()


def _count_rows(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    counts = {t: con.execute(f"SELECT count(*) FROM lake.{t}").fetchone()[0] for t in _tables(con)}
    return {t: n for t, n in counts.items() if n}


def _store(settings: LakeSettings) -> str:
    """Which storage a data path is on: this machine's disk, or one S3 endpoint."""
    return settings.s3_endpoint or "local"


def _table_of(batch: pa.RecordBatch) -> pa.Table:
    import pyarrow as pa

    return pa.Table.from_batches([batch])
