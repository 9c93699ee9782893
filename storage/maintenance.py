"""Lake upkeep: merge small files, delete what nothing reads, expire old snapshots if asked.

Why: every DuckLake commit of a table adds a Parquet file (or, for a handful of rows,
rows inlined in the catalog), and a cycle commits dozens of times. A lake written
nightly for a year holds tens of thousands of small files, and a scan opens every one
(measured here: 300 commits of 100 rows, a count took 3x as long as on the merged
file). DuckLake never deletes a file by itself: files merged away stay on disk, and a
batch staged by a writer that died before its commit (storage.lake.StagedRows) stays
there unregistered.

`maintain_lake` runs DuckLake's own maintenance calls in the order its CHECKPOINT does,
with flywheel's policy:
1. inlined rows are written out to Parquet;
2. adjacent files smaller than `max_file_mb` are merged, table by table. Time travel
   still reads the merged file as of any snapshot (DuckLake keeps each row's snapshot
   range), so `flywheel sql --snapshot N` and the history of `models` stay intact;
3. snapshots older than `snapshot_retention_days` are expired, only when it is set:
   0 (the default) keeps every snapshot, since a model's status history is its
   snapshots (tasks/release/promote.py);
4. files scheduled for deletion, and orphaned files (in the data path, known to no
   snapshot), are deleted once older than `file_grace_hours`: a reader that began
   before the merge may still scan a merged-away file, and a writer staging a batch
   right now has files no snapshot knows yet.
Each call commits on its own: a step that fails leaves the lake as the steps before
left it, and running again picks up where it stopped.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone

import duckdb

from storage.config_file import ConfigError, lake_settings, load_section
from storage.lake import open_lake
from storage.lake_turn import lake_turn


@dataclass(frozen=True)
class MaintenanceConfig:
    """`[maintenance]` in flywheel.toml; `FLYWHEEL_MAINTENANCE_<FIELD>` overrides."""

    max_file_mb: int = 128
    """Files at least this large are left as they are: a merge rewrites what it merges,
    so this bounds the bytes one run rewrites per table."""
    snapshot_retention_days: float = 0.0
    """Expire snapshots older than this many days (time travel stops there). 0: keep all."""
    file_grace_hours: float = 24.0
    """Unreferenced files are deleted only once this old (readers and writers in flight)."""
    model_weights_days: float = 0.0
    """Delete the weights of models nothing serves (rejected, or a candidate its own cycle
    went past) this many days after their cycle completed: tasks/release/retention.py.
    0: keep every model's weights."""

    def __post_init__(self) -> None:
        if self.max_file_mb < 1:
            raise ValueError(f"max_file_mb must be at least 1, got {self.max_file_mb}")
        if not 0 <= self.model_weights_days < math.inf:
            raise ValueError(f"model_weights_days must be finite and >= 0 (0: keep all), got {self.model_weights_days}")
        if not (0 <= self.snapshot_retention_days < math.inf and 0 <= self.file_grace_hours < math.inf):
            raise ValueError("snapshot_retention_days and file_grace_hours must be finite and >= 0 (0 days: keep every "
                             f"snapshot), got {self.snapshot_retention_days} and {self.file_grace_hours}")


@dataclass(frozen=True)
class MaintenanceReport:
    files_before: int
    """Data files the newest snapshot reads, over every table."""
    files_after: int
    tables_flushed: int
    """Tables whose inlined rows were written out to Parquet."""
    files_merged: int
    """Small files rewritten into `files_written` larger ones."""
    files_written: int
    snapshots_expired: int
    files_deleted: int
    """Merged-away or expired files removed from the data path."""
    orphans_deleted: int
    """Files no snapshot knows (staged by a writer that never committed), removed."""
    snapshots_left: int
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def maintain_lake(con: duckdb.DuckDBPyConnection, cfg: MaintenanceConfig = MaintenanceConfig(),
                  now: datetime | None = None) -> MaintenanceReport:
    """Run the upkeep on the lake attached to `con` (writable) and say what it did."""
    started = time.perf_counter()
    now = now or datetime.now(timezone.utc)
    grace = now - timedelta(hours=cfg.file_grace_hours)
    with lake_turn():
        before = live_files(con)
        flushed = con.execute("CALL ducklake_flush_inlined_data('lake')").fetchall()
        merged = con.execute("CALL ducklake_merge_adjacent_files('lake', max_file_size => ?)",
                             [cfg.max_file_mb * 1024 * 1024]).fetchall()
        expired = []
        if cfg.snapshot_retention_days > 0:
            cutoff = now - timedelta(days=cfg.snapshot_retention_days)
            expired = con.execute("CALL ducklake_expire_snapshots('lake', older_than => ?)", [cutoff]).fetchall()
        deleted = con.execute("CALL ducklake_cleanup_old_files('lake', older_than => ?)", [grace]).fetchall()
        orphans = con.execute("CALL ducklake_delete_orphaned_files('lake', older_than => ?)", [grace]).fetchall()
        after = live_files(con)
        snapshots = con.execute("SELECT count(*) FROM ducklake_snapshots('lake')").fetchone()[0]
    return MaintenanceReport(
        files_before=before, files_after=after,
        tables_flushed=sum(1 for row in flushed if row[-1]),
        files_merged=sum(int(row[2]) for row in merged), files_written=sum(int(row[3]) for row in merged),
        snapshots_expired=len(expired), files_deleted=len(deleted), orphans_deleted=len(orphans),
        snapshots_left=int(snapshots), seconds=round(time.perf_counter() - started, 3))


def maintain_configured_lake(**overrides: float) -> MaintenanceReport:
    """The upkeep on the lake flywheel.toml names, by its `[maintenance]` policy with
    `overrides` (field=value, None = as configured): what the flow and the CLI run."""
    cfg = load_section(MaintenanceConfig, "maintenance")
    try:
        cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:  # an option's value, judged by the config's own checks
        raise ConfigError(str(exc)) from None
    con = open_lake(lake_settings())
    try:
        return maintain_lake(con, cfg)
    finally:
        con.close()


def live_files(con: duckdb.DuckDBPyConnection) -> int:
    """Data files the newest snapshot reads, over every table of the lake."""
    tables = [row[0] for row in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake'")
              .fetchall()]
    return sum(con.execute("SELECT count(*) FROM ducklake_list_files('lake', ?)", [name]).fetchone()[0]
               for name in tables)
