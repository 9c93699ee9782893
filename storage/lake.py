"""Open the lake: one DuckLake catalog named `lake`, Parquet on disk or on S3.

`open_lake` is the only way in. It loads DuckDB's extensions from the PyPI
packages (never from the network), points DuckDB's S3 client at the configured
endpoint, attaches the catalog (SQLite file embedded, PostgreSQL in a cluster) and
creates any missing table from `storage.schemas`. Writers append Arrow tables
through `append_rows`, which refuses a schema that is not the table's. A stage
makes its writes visible in one DuckLake commit (`with transaction(con): ...`);
a stage writing more rows than fit in memory stages Parquet first (`StagedRows`).
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from typing import TYPE_CHECKING

import duckdb

from storage.settings import LakeSettings

if TYPE_CHECKING:
    import pyarrow as pa

# storage.schemas (pyarrow, numpy) is imported where a table is written or created, not
# here: a reader such as `flywheel sql` never needs it, and it is a fifth of its start-up.


class LakeError(RuntimeError):
    """The lake could not be opened or written; the message says what to fix."""


def open_lake(
    settings: LakeSettings, *, read_only: bool = False, snapshot: int | None = None,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the DuckLake catalog attached as `lake` (and USEd).

    read_only: the catalog is attached READ_ONLY, so DuckDB itself refuses writes.
    snapshot: read the lake as of that DuckLake snapshot (implies read_only).
    """
    read_only = read_only or snapshot is not None
    if settings.home.exists() and not settings.home.is_dir():
        raise LakeError(f"FLYWHEEL_HOME {settings.home} is a file: the lake's home must be a folder")
    if read_only and not settings.catalog_dsn and not (settings.home / "catalog.sqlite").exists():
        raise LakeError(f"no lake at {settings.home} yet (FLYWHEEL_HOME): the first write creates it "
                        "(`flywheel ingest`, `flywheel model import`, `flywheel demo`)")
    try:
        settings.home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LakeError(f"FLYWHEEL_HOME {settings.home} cannot be made the lake's folder: {exc}") from exc
    try:
        # Spills go under the lake's home: DuckDB's default (./.tmp) would land in whatever
        # folder the command ran from.
        con = duckdb.connect(config={"threads": settings.duckdb_threads,
                                     "memory_limit": settings.duckdb_memory_limit,
                                     "temp_directory": str(settings.home / "tmp")})
    except duckdb.Error as exc:
        raise LakeError(f"DuckDB refused [lake] duckdb_memory_limit = {settings.duckdb_memory_limit!r} or "
                        f"duckdb_threads = {settings.duckdb_threads} (flywheel.toml or FLYWHEEL_DUCKDB_*): "
                        f"{exc}") from exc
    _load_extensions(con, settings)
    con.execute("SET TimeZone = 'UTC'")
    if settings.uses_s3:
        if not read_only:
            # imported here, not at the top: a local lake never needs the minio client,
            # and importing it costs every process that opens one (`flywheel sql` too) 0.1 s
            from storage.objects import ObjectStore

            ObjectStore(settings).ensure_bucket()
        _create_s3_secret(con, settings)
    else:
        (settings.home / "data").mkdir(exist_ok=True)
    options = [f"DATA_PATH '{quote_literal(settings.data_path)}'"]
    if read_only:
        options.append("READ_ONLY")
    if snapshot is not None:
        options.append(f"SNAPSHOT_VERSION {int(snapshot)}")
    try:
        con.execute(f"ATTACH '{quote_literal(settings.catalog_uri)}' AS lake ({', '.join(options)})")
    except duckdb.Error as exc:
        con.close()
        raise LakeError(_explain_attach_error(exc, settings)) from exc
    con.execute("USE lake")
    # a literal, not a `?` parameter: DuckDB imports pandas to bind any Python parameter,
    # a fifth of a second on every open of the lake (`flywheel sql` included)
    con.execute(f"SET VARIABLE flywheel_data_path = '{quote_literal(settings.data_path)}'")
    if not read_only:
        ensure_tables(con)
    return con


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create every table of storage.schemas that the catalog lacks, and add the columns
    a table created by an earlier version lacks (new columns only ever go at the end)."""
    from storage.schemas import SCHEMAS

    existing: dict[str, list[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM duckdb_columns() "
                                     "WHERE database_name = 'lake' ORDER BY table_name, column_index").fetchall():
        existing.setdefault(table, []).append(column)
    missing = [name for name in SCHEMAS if name not in existing]
    short = {name: SCHEMAS[name].names[len(cols):] for name, cols in existing.items()
             if name in SCHEMAS and len(cols) < len(SCHEMAS[name].names)}
    if not missing and not short:
        return
    with transaction(con):
        for name in missing:
            con.register("_flywheel_empty", SCHEMAS[name].empty_table())
            con.execute(f"CREATE TABLE IF NOT EXISTS lake.{name} AS SELECT * FROM _flywheel_empty LIMIT 0")
            con.unregister("_flywheel_empty")
        for name, columns in short.items():
            con.register("_flywheel_empty", SCHEMAS[name].empty_table())
            types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE _flywheel_empty)").fetchall())
            con.unregister("_flywheel_empty")
            for column in columns:
                con.execute(f"ALTER TABLE lake.{name} ADD COLUMN IF NOT EXISTS {column} {types[column]}")


def append_rows(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table) -> int:
    """Insert `rows` into lake.`table`; the Arrow schema must be the table's own."""
    _check_schema(table, rows)
    if rows.num_rows == 0:
        return 0
    view = f"_flywheel_rows_{table}"
    con.register(view, rows)
    try:
        con.execute(f"INSERT INTO lake.{table} SELECT * FROM {view}")
    finally:
        con.unregister(view)
    return rows.num_rows


class StagedRows:
    """Rows written as Parquet now, made visible later in one DuckLake commit.

    A large batch inserted inside one open DuckLake transaction is held in memory
    until COMMIT (~the size of the data). Staging each chunk as a Parquet file under
    the data path and registering all files at the end (`ducklake_add_data_files`)
    keeps memory flat and the commit atomic: files never registered are invisible,
    and a rerun overwrites them under the same names.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, name: str) -> None:
        self.con = con
        data_path = con.execute("SELECT getvariable('flywheel_data_path')").fetchone()[0]
        self.prefix = f"{data_path}staging/{name}/"
        self.files: dict[str, list[str]] = {}
        self.checked: set[tuple[str, str]] = set()
        if not self.prefix.startswith("s3://"):
            Path(self.prefix).mkdir(parents=True, exist_ok=True)

    def stage(self, table: str, rows: pa.Table) -> None:
        _check_schema(table, rows)
        if rows.num_rows == 0:
            return
        files = self.files.setdefault(table, [])
        path = f"{self.prefix}{table}-{len(files):05d}.parquet"
        view = f"_flywheel_stage_{table}"
        self.con.register(view, rows)
        try:
            self.con.execute(f"COPY {view} TO '{quote_literal(path)}' (FORMAT parquet, COMPRESSION zstd)")
        finally:
            self.con.unregister(view)
        files.append(path)

    def stage_query(self, table: str, query: str, *, compression: str = "snappy",
                    row_group_size: int = 20_000) -> None:
        """Stage the rows of a DuckDB query, written by DuckDB without passing through
        Python; its result columns must be the table's schema. Snappy is DuckLake's own
        default codec. Row groups of 20k rows (~8 MB of logs once compressed) are
        compressed by all of DuckDB's threads at once (one 122,880-row group per chunk
        took twice as long) and make the writer buffer less."""
        if (table, query) not in self.checked:  # a batch stages the same query once per chunk
            _check_schema(table, self.con.sql(f"SELECT * FROM ({query}) LIMIT 0").to_arrow_table())
            self.checked.add((table, query))
        files = self.files.setdefault(table, [])
        path = f"{self.prefix}{table}-{len(files):05d}.parquet"
        options = f"FORMAT parquet, COMPRESSION {compression}, ROW_GROUP_SIZE {int(row_group_size)}"
        if self.con.execute(f"COPY ({query}) TO '{quote_literal(path)}' ({options})").fetchone()[0]:
            files.append(path)  # an empty file is left unregistered, so it stays invisible

    def register(self) -> None:
        """Add every staged file to its table; call inside `transaction`."""
        for table, files in self.files.items():
            for path in files:
                self.con.execute("CALL ducklake_add_data_files('lake', ?, ?)", [table, path])


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection, message: str | None = None) -> Iterator[None]:
    """One DuckLake commit: everything inside becomes visible together or not at all."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        if message:
            con.execute("CALL lake.set_commit_message('flywheel', ?)", [message])
        con.execute("COMMIT")
    except BaseException:
        # a COMMIT that failed has already ended the transaction; its error is the one
        # to raise, not "cannot rollback - no transaction is active"
        with contextlib.suppress(duckdb.TransactionException):
            con.execute("ROLLBACK")
        raise


def _check_schema(table: str, rows: pa.Table) -> None:
    from storage.schemas import SCHEMAS

    expected = SCHEMAS.get(table)
    if expected is None:
        raise LakeError(f"no table {table!r} in storage.schemas; known: {', '.join(SCHEMAS)}")
    if not rows.schema.equals(expected):
        raise LakeError(f"rows for {table} do not match its schema:\n got      {rows.schema}\n expected {expected}")


def current_snapshot(con: duckdb.DuckDBPyConnection) -> int:
    return int(con.execute("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')").fetchone()[0])


def extensions_for(settings: LakeSettings) -> tuple[str, ...]:
    """The extensions this lake needs: its catalog's, and httpfs only for data on S3.

    Each LOAD verifies the extension's signature over the whole file (20-40 MB each,
    ~0.08 s), so loading all four cost every open_lake ~0.35 s; a per-file ingest task
    opens the lake once per file.
    """
    catalog = "postgres" if settings.catalog_dsn else "sqlite"
    return ("ducklake", catalog) + (("httpfs",) if settings.uses_s3 else ())


def _load_extensions(con: duckdb.DuckDBPyConnection, settings: LakeSettings) -> None:
    # The bundled extension files are copied into a folder of ours once; autoinstall is
    # off so a missing extension is an error here, never a download attempt.
    from duckdb_extensions import import_extension

    ext_dir = (settings.home / "duckdb_extensions").resolve()
    con.execute(f"SET extension_directory = '{quote_literal(str(ext_dir))}'")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    installed = {row[0] for row in con.execute(
        "SELECT extension_name FROM duckdb_extensions() WHERE installed").fetchall()}
    for name in extensions_for(settings):
        if name not in installed:
            import_extension(name, con=con)
        con.execute(f"LOAD {name}")


def _create_s3_secret(con: duckdb.DuckDBPyConnection, settings: LakeSettings) -> None:
    con.execute(
        "CREATE OR REPLACE SECRET flywheel_s3 (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, "
        "URL_STYLE 'path', USE_SSL ?)",
        [settings.s3_access_key, settings.s3_secret_key, settings.s3_region,
         settings.s3_endpoint, settings.s3_secure],
    )


def _explain_attach_error(exc: duckdb.Error, settings: LakeSettings) -> str:
    text = str(exc)
    where = settings.catalog_dsn and "the PostgreSQL catalog (FLYWHEEL_CATALOG_DSN)" or str(settings.home)
    if "403" in text or "SignatureDoesNotMatch" in text or "InvalidAccessKeyId" in text:
        return (f"S3 refused the credentials for bucket {settings.s3_bucket!r} at {settings.s3_endpoint}: "
                "check FLYWHEEL_S3_ACCESS_KEY / FLYWHEEL_S3_SECRET_KEY")
    if "lock" in text.lower():
        return f"the lake catalog at {where} is locked by another process: {text}"
    moved = re.search(r'does not match existing data path in the catalog "([^"]+)"', text)
    if moved:  # DuckLake's own advice (OVERRIDE_DATA_PATH) is no option a flywheel user has
        return (f"the lake at {where} keeps its data at {moved.group(1)}, not {settings.data_path}: a lake "
                "cannot move (its catalog holds absolute paths of staged files); set FLYWHEEL_HOME (or "
                "[lake] home, or the S3 settings) back to where it was made")
    return f"could not open the lake at {where}: {text}"


def quote_literal(text: str) -> str:
    """`text` for inside a SQL string literal: its quotes doubled."""
    return text.replace("'", "''")
