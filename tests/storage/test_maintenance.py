"""Lake upkeep: small files merged, every snapshot still readable, unread files deleted only
after their grace, snapshots expired only when asked; on disk and on a real S3 server."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import LakeError, StagedRows, append_rows, current_snapshot, open_lake, transaction
from storage.maintenance import MaintenanceConfig, live_files, maintain_lake
from storage.objects import ObjectStore
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings

COMMITS, ROWS = 12, 50  # 50 rows a commit are written as a file; 3 are inlined in the catalog


def _rows(commit: int, n: int) -> pa.Table:
    return pa.Table.from_pylist(
        [{"batch_id": f"b{commit}", "line_no": i, "raw": f"line {commit}/{i}", "kind": "bad_json", "reason": "r",
          "cycle_id": "c"} for i in range(n)], schema=SCHEMAS["quarantine"])


def _small_commits(settings: LakeSettings) -> tuple[duckdb.DuckDBPyConnection, dict[int, int]]:
    """A lake whose quarantine grew by many small commits and a few inlined ones, and a
    batch staged by a writer that never committed; returns rows seen at each snapshot."""
    con = open_lake(settings)
    seen = {}
    for commit in range(COMMITS + 3):
        with transaction(con):
            append_rows(con, "quarantine", _rows(commit, ROWS if commit < COMMITS else 3))
        seen[current_snapshot(con)] = con.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0]
    StagedRows(con, "never-committed").stage("quarantine", _rows(99, ROWS))
    return con, seen


def _parquet_on_storage(settings: LakeSettings) -> int:
    if settings.uses_s3:
        keys = [o.key for o in ObjectStore(settings).list(settings.s3_bucket, settings.lake_prefix)]
        return sum(key.endswith(".parquet") for key in keys)
    return len(list((settings.home / "data").rglob("*.parquet")))


def _content(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return con.execute("SELECT batch_id, line_no, raw FROM lake.quarantine ORDER BY ALL").fetchall()


def test_small_files_merge_every_snapshot_still_reads_the_same_and_orphans_go(any_lake_settings):
    con, seen = _small_commits(any_lake_settings)
    content = _content(con)
    assert live_files(con) == COMMITS
    assert _parquet_on_storage(any_lake_settings) == COMMITS + 1  # + the staged orphan

    report = maintain_lake(con, MaintenanceConfig(file_grace_hours=0))

    assert (report.files_before, report.files_after) == (COMMITS, 1)
    assert report.tables_flushed == 1 and report.files_merged >= COMMITS and report.files_written == 1
    assert report.files_deleted == COMMITS + 1 and report.orphans_deleted == 1
    assert report.snapshots_expired == 0 and report.snapshots_left > len(seen)
    assert _parquet_on_storage(any_lake_settings) == 1
    assert _content(con) == content
    con.close()
    for snapshot, rows in seen.items():  # time travel reads the merged file as of each commit
        past = open_lake(any_lake_settings, snapshot=snapshot)
        assert past.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == rows, snapshot
        past.close()


def test_files_wait_out_their_grace_and_snapshots_expire_only_when_asked(lake_settings):
    con, seen = _small_commits(lake_settings)
    report = maintain_lake(con, MaintenanceConfig())  # grace 24 h, keep every snapshot
    assert report.files_after == 1 and report.files_deleted == report.orphans_deleted == 0
    assert report.snapshots_expired == 0
    # merged away: the 12 and the file the inlined rows were written to; the orphan; the merged file
    assert _parquet_on_storage(lake_settings) == COMMITS + 3

    later = datetime.now(timezone.utc) + timedelta(days=3)
    report = maintain_lake(con, MaintenanceConfig(snapshot_retention_days=1), now=later)
    assert report.snapshots_expired >= len(seen) and report.snapshots_left == 1
    assert report.files_deleted == COMMITS + 1 and report.orphans_deleted == 1
    assert _parquet_on_storage(lake_settings) == 1
    assert con.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == COMMITS * ROWS + 9
    con.close()
    with pytest.raises(LakeError, match=f"No snapshot found at version {min(seen)}"):
        open_lake(lake_settings, snapshot=min(seen)).execute("SELECT count(*) FROM lake.quarantine").fetchall()


def test_maintenance_config_refuses_what_cannot_be_meant():
    with pytest.raises(ValueError, match="max_file_mb"):
        MaintenanceConfig(max_file_mb=0)
    with pytest.raises(ValueError, match="keep every snapshot"):
        MaintenanceConfig(snapshot_retention_days=-1)
    for endless in (float("nan"), float("inf")):  # a NaN reached int() and crashed the maintenance
        with pytest.raises(ValueError, match="must be finite and >= 0"):
            MaintenanceConfig(file_grace_hours=endless)
    for days in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="model_weights_days must be finite and >= 0"):
            MaintenanceConfig(model_weights_days=days)


def test_the_command_reports_what_it_did(tmp_path, monkeypatch):
    settings = LakeSettings(home=tmp_path / "home")
    con, _ = _small_commits(settings)
    con.close()
    monkeypatch.setenv("FLYWHEEL_HOME", str(settings.home))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "flywheel.toml").write_text("[maintenance]\nfile_grace_hours = 0\nmodel_weights_days = 30\n")
    result = CliRunner().invoke(app, ["lake", "maintain"])
    assert result.exit_code == 0, result.output
    assert f"{COMMITS} -> 1" in result.output and "1 orphaned files" in result.output
    said = " ".join(result.output.split())  # rich wraps lines at the console's width
    assert "0 jobs, 0.00 GiB" in said and "0 models, 0.00 GiB" in said
    bad = CliRunner().invoke(app, ["lake", "maintain"], env={"FLYWHEEL_MAINTENANCE_MAX_FILE_MB": "0"})
    assert bad.exit_code == 2 and "max_file_mb" in bad.output
