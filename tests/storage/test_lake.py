"""The lake: schemas, atomic commits, snapshots, readers beside a writer, S3 and PostgreSQL."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import duckdb
import pyarrow as pa
import pytest

from storage.lake import LakeError, append_rows, current_snapshot, open_lake, transaction
from storage.objects import ObjectStore, ObjectStoreError
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings


def _quarantine_rows(n: int, batch: str = "b1") -> pa.Table:
    return pa.Table.from_pylist(
        [{"batch_id": batch, "line_no": i, "raw": f"line {i}", "kind": "bad_json", "reason": "r", "cycle_id": "c"}
         for i in range(n)], schema=SCHEMAS["quarantine"])


def test_every_table_exists_with_its_declared_columns(any_lake_settings):
    con = open_lake(any_lake_settings)
    for name, schema in SCHEMAS.items():
        columns = [row[0] for row in con.execute(f"DESCRIBE lake.{name}").fetchall()]
        assert columns == schema.names, name


_OPTIONAL = {"ducklake", "sqlite_scanner", "postgres_scanner", "httpfs"}


def _loaded(con) -> set[str]:
    return _OPTIONAL & {row[0] for row in con.execute(
        "SELECT extension_name FROM duckdb_extensions() WHERE loaded").fetchall()}


def test_a_lake_loads_only_the_extensions_it_needs(any_lake_settings):
    """Each LOAD verifies a 20-40 MB signature; a per-file task must not pay for unused ones."""
    con = open_lake(any_lake_settings)
    wanted = {"ducklake", "sqlite_scanner"} | ({"httpfs"} if any_lake_settings.uses_s3 else set())
    assert _loaded(con) == wanted


def test_append_refuses_a_schema_that_is_not_the_tables(lake_settings):
    con = open_lake(lake_settings)
    wrong = pa.table({"batch_id": ["b"], "line_no": ["not an int"]})
    with pytest.raises(LakeError, match="do not match its schema"):
        append_rows(con, "quarantine", wrong)
    with pytest.raises(LakeError, match="no table"):
        append_rows(con, "nope", wrong)


def test_a_failed_transaction_leaves_nothing(lake_settings):
    con = open_lake(lake_settings)
    with pytest.raises(RuntimeError):
        with transaction(con):
            append_rows(con, "quarantine", _quarantine_rows(5))
            raise RuntimeError("crash before commit")
    assert con.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == 0


def test_snapshots_read_the_lake_as_it_was(lake_settings):
    con = open_lake(lake_settings)
    with transaction(con):
        append_rows(con, "quarantine", _quarantine_rows(3))
    first = current_snapshot(con)
    with transaction(con):
        append_rows(con, "quarantine", _quarantine_rows(4, batch="b2"))
    con.close()
    old = open_lake(lake_settings, snapshot=first)
    assert old.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == 3
    now = open_lake(lake_settings, read_only=True)
    assert now.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == 7


def test_read_only_sessions_refuse_writes(lake_settings):
    open_lake(lake_settings).close()
    ro = open_lake(lake_settings, read_only=True)
    with pytest.raises(duckdb.Error, match="read-only"):
        ro.execute("DELETE FROM lake.quarantine")


_WRITER = textwrap.dedent("""
    import sys, time, pyarrow as pa
    from storage.lake import open_lake, append_rows, transaction
    from storage.schemas import SCHEMAS
    from storage.settings import LakeSettings
    con = open_lake(LakeSettings(home=sys.argv[1]))
    rows = pa.Table.from_pylist([{"batch_id": "w", "line_no": i, "raw": "x", "kind": "k", "reason": "r",
                                  "cycle_id": "c"} for i in range(1000)], schema=SCHEMAS["quarantine"])
    with transaction(con):
        append_rows(con, "quarantine", rows)
        print("written", flush=True)
        sys.stdin.readline()          # hold the transaction open until the test says commit
    print("committed", flush=True)
""")


def test_another_process_reads_while_a_writer_is_mid_commit(lake_settings):
    open_lake(lake_settings).close()
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(lake_settings.home)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "written"
        reader = open_lake(lake_settings, read_only=True)
        assert reader.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == 0
        reader.close()
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "committed"
        assert writer.wait(30) == 0
        reader = open_lake(lake_settings, read_only=True)
        assert reader.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == 1000
    finally:
        writer.kill()


def test_parquet_lands_in_the_bucket(s3_lake_settings):
    con = open_lake(s3_lake_settings)
    with transaction(con):
        append_rows(con, "quarantine", _quarantine_rows(200))
    assert con.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == 200
    keys = [o.key for o in ObjectStore(s3_lake_settings).list(s3_lake_settings.s3_bucket, "lake/")]
    assert any(k.endswith(".parquet") for k in keys), keys
    # nothing of the data is on local disk: only the catalog and extensions are
    assert not list(s3_lake_settings.home.rglob("*.parquet"))


def test_wrong_s3_credentials_give_a_clear_error(tmp_path, s3_server):
    bad = LakeSettings(home=tmp_path, s3_endpoint=s3_server.endpoint, s3_bucket="flywheel-bad",
                       s3_access_key=s3_server.access_key, s3_secret_key="not-the-secret")
    with pytest.raises(ObjectStoreError, match="refused the credentials.*FLYWHEEL_S3_SECRET_KEY"):
        open_lake(bad)


def test_settings_refuse_unusable_values():
    with pytest.raises(ValueError, match="without a scheme"):
        LakeSettings(s3_endpoint="http://127.0.0.1:9000", s3_access_key="a", s3_secret_key="b")
    with pytest.raises(ValueError, match="not a valid bucket name"):
        LakeSettings(s3_endpoint="127.0.0.1:9000", s3_bucket="B", s3_access_key="a", s3_secret_key="b")
    with pytest.raises(ValueError, match="ACCESS_KEY"):
        LakeSettings(s3_endpoint="127.0.0.1:9000")


def test_a_home_that_cannot_hold_the_lake_is_a_clear_error(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    for read_only in (False, True):
        with pytest.raises(LakeError, match="is a file: the lake's home must be a folder"):
            open_lake(LakeSettings(home=a_file), read_only=read_only)
    with pytest.raises(LakeError, match="cannot be made the lake's folder"):
        open_lake(LakeSettings(home=a_file / "below"))
    with pytest.raises(LakeError, match="DuckDB refused .*duckdb_memory_limit = 'lots'.*Memory must have a number"):
        open_lake(LakeSettings(home=tmp_path / "home", duckdb_memory_limit="lots"))
    open_lake(LakeSettings(home=tmp_path / "made-here")).close()
    shutil.copytree(tmp_path / "made-here", tmp_path / "moved")  # a restored backup, a renamed folder
    with pytest.raises(LakeError, match=f"keeps its data at {tmp_path}/made-here/data/.*a lake cannot move"):
        open_lake(LakeSettings(home=tmp_path / "moved"), read_only=True)


_PG_WRITER = textwrap.dedent("""
    import sys, json, pyarrow as pa
    from pathlib import Path
    from storage.lake import open_lake
    from storage.settings import LakeSettings
    from tasks.ingest.batch import IngestConfig, ingest_file
    settings = LakeSettings(home=sys.argv[1], catalog_dsn=sys.argv[2])
    con = open_lake(settings)
    results = [ingest_file(con, Path(p), p, IngestConfig(chunk_lines=1000), "pg").__dict__ for p in sys.argv[3:]]
    print(json.dumps(results))
""")


def test_two_processes_write_a_postgres_catalog_at_once(tmp_path, pg_dsn):
    from tests.tasks.logs import write_logs

    data = tmp_path / "data"
    files = {who: [write_logs(tmp_path / f"{who}-{i}.jsonl", 3000, seed=10 * w + i) for i in range(3)]
             for w, who in enumerate(("a", "b"))}
    open_lake(LakeSettings(home=data, catalog_dsn=pg_dsn)).close()
    procs = [subprocess.Popen([sys.executable, "-c", _PG_WRITER, str(data), pg_dsn, *map(str, paths)],
                              stdout=subprocess.PIPE, text=True) for paths in files.values()]
    outputs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    written = sum(r["rows_ok"] for out in outputs for r in out)
    assert written == 6 * 3000
    con = open_lake(LakeSettings(home=data, catalog_dsn=pg_dsn), read_only=True)
    assert _loaded(con) == {"ducklake", "postgres_scanner"}
    assert con.execute("SELECT count(*) FROM lake.failure_logs").fetchone()[0] == 6 * 3000
    assert con.execute("SELECT count(*) FROM lake.ingest_batches").fetchone()[0] == 6


def test_a_lake_from_before_a_column_was_added_gains_it_on_open(lake_settings):
    con = open_lake(lake_settings)
    for added in ("first_line", "source_version"):  # as an older flywheel made it
        con.execute(f"ALTER TABLE lake.ingest_batches DROP COLUMN {added}")
    con.execute("INSERT INTO lake.ingest_batches VALUES ('b1', 'old.jsonl', 3, 0, now(), 'c0')")
    con.close()
    con = open_lake(lake_settings)
    columns = [row[0] for row in con.execute("DESCRIBE lake.ingest_batches").fetchall()]
    assert columns == SCHEMAS["ingest_batches"].names
    assert con.execute("SELECT batch_id, source_version, first_line FROM lake.ingest_batches").fetchall() == [
        ("b1", None, None)]
    append_rows(con, "ingest_batches", pa.Table.from_pylist(
        [{"batch_id": "b2", "source_uri": "new.jsonl", "rows_ok": 1, "rows_quarantined": 0,
          "ingested_at": None, "cycle_id": "c1", "source_version": "10:1"}], schema=SCHEMAS["ingest_batches"]))
    assert con.execute("SELECT count(*) FROM lake.ingest_batches").fetchone()[0] == 2
