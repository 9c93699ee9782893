"""The weights of models nothing will serve, deleted by lake maintenance when asked.

Every round of a cycle exports a model (540 MB for SmolLM2-135M in float32, ~14 GB for a
7B model in bf16) and the gate keeps at most the cycle's last one: the rounds before it
stay `candidate`, a refused one becomes `rejected`, and both keep their weights for
ever. With `[maintenance] model_weights_days` > 0 their weights are deleted that many
days after their cycle completed, and the row says when (`models.weights_deleted_at`):
its lineage, evaluations and training metrics stay, and `promote` or anything that
would load it says the weights are gone rather than failing on a missing folder.

Left alone: production, retired models (the rollback targets), imported and registered
ones, models of cycles running or failed, and any folder outside FLYWHEEL_HOME (a model
registered from the user's own folder is theirs).

On a lake in a bucket, a model's folders on this machine (the train job's export it was
uploaded from, a download) are copies: `drop_local_copies` deletes them, every time
maintenance runs, for every model but production and those of running or failed cycles,
once the bucket is seen to hold each file at its size and the copy was not made or handed
out within `[maintenance] file_grace_hours` (an evaluation or a server may be loading it). A job that needs one again
downloads it (tasks/release/models.py: local_model_dir). Without this, each round's
export stayed on the trainer's disk for ever, rollback targets included.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb

from storage.config_file import lake_settings, load_section
from storage.lake import open_lake, transaction
from storage.maintenance import MaintenanceConfig
from storage.objects import ObjectStore, parse_s3_uri
from storage.settings import LakeSettings
from trainer.job import jobs_root, model_dir


@dataclass(frozen=True)
class WeightsDropped:
    models: int
    """Models whose weights were deleted (and marked so)."""
    bytes: int
    """Bytes freed on this machine (objects deleted from the bucket are not counted)."""


def drop_old_weights(con: duckdb.DuckDBPyConnection, settings: LakeSettings, days: float,
                     now: datetime | None = None) -> WeightsDropped:
    """Delete the weights of the models the module docstring names, older than `days`
    since their cycle completed; 0 days deletes nothing."""
    if days <= 0:
        return WeightsDropped(0, 0)
    cutoff = (now or datetime.now(timezone.utc)) - timedelta(days=days)
    due = con.execute(
        "SELECT m.policy_version, m.uri FROM lake.models m JOIN lake.cycles c USING (cycle_id) "
        "WHERE m.status IN ('rejected', 'candidate') AND m.weights_deleted_at IS NULL "
        "AND c.status = 'completed' AND c.finished_at < ? ORDER BY m.policy_version", [cutoff]).fetchall()
    dropped, freed = 0, 0
    for version, uri in due:
        # an S3 model's copies here: the job's export it was uploaded from, and a download
        folders = [model_dir(jobs_root(settings.home) / version), settings.home / "models" / version]
        if uri.startswith("s3://"):
            ObjectStore(settings).remove_prefix(*parse_s3_uri(uri))
        elif _inside(Path(uri), settings.home):
            folders.append(Path(uri))
        else:
            continue  # a folder of the user's own
        freed += sum(_delete(folder) for folder in folders)
        with transaction(con, f"model {version[:12]}: weights deleted by maintenance"):
            con.execute("UPDATE lake.models SET weights_deleted_at = ? WHERE policy_version = ?",
                        [now or datetime.now(timezone.utc), version])
        dropped += 1
    return WeightsDropped(dropped, freed)


def drop_local_copies(con: duckdb.DuckDBPyConnection, settings: LakeSettings, grace_hours: float = 24.0,
                      now: float | None = None) -> WeightsDropped:
    """Delete this machine's copies of models kept in the bucket (the module docstring's
    rule); `models` counts the models that had one. A copy handed out or made within
    `grace_hours` (its folder's mtime: tasks/release/models.py: local_model_dir touches it)
    is left alone: an evaluation or a server may be loading it now."""
    cutoff = (time.time() if now is None else now) - grace_hours * 3600
    kept = con.execute(
        "SELECT m.policy_version, m.uri FROM lake.models m LEFT JOIN lake.cycles c USING (cycle_id) "
        "WHERE m.uri LIKE 's3://%' AND m.weights_deleted_at IS NULL AND m.status <> 'production' "
        "AND coalesce(c.status, 'completed') = 'completed' ORDER BY m.policy_version").fetchall()
    store, dropped, freed = None, 0, 0
    for version, uri in kept:
        folders = [f for f in (model_dir(jobs_root(settings.home) / version), settings.home / "models" / version)
                   if f.is_dir() and not f.is_symlink() and f.stat().st_mtime < cutoff]
        store = store or ObjectStore(settings)
        held = {info.key: info.size for info in store.list(*_prefix(uri))} if folders else {}
        copies = [f for f in folders if _held_in_bucket(f, uri, held)]
        freed += sum(_delete(folder) for folder in copies)
        dropped += bool(copies)
    return WeightsDropped(dropped, freed)


def _prefix(uri: str) -> tuple[str, str]:
    bucket, prefix = parse_s3_uri(uri)
    return bucket, prefix.rstrip("/") + "/"


def _held_in_bucket(folder: Path, uri: str, held: dict[str, int]) -> bool:
    """Whether every file of `folder` is in the bucket under `uri` at its size."""
    prefix = _prefix(uri)[1]
    files = [f for f in folder.rglob("*") if f.is_file()]
    return bool(files) and all(held.get(prefix + f.relative_to(folder).as_posix()) == f.stat().st_size
                               for f in files)


def drop_configured_weights() -> WeightsDropped:
    """`drop_old_weights` on the lake and `[maintenance]` policy flywheel.toml names."""
    cfg = load_section(MaintenanceConfig, "maintenance")
    if cfg.model_weights_days <= 0:
        return WeightsDropped(0, 0)
    settings = lake_settings()
    con = open_lake(settings)
    try:
        return drop_old_weights(con, settings, cfg.model_weights_days)
    finally:
        con.close()


def drop_configured_copies() -> WeightsDropped:
    """`drop_local_copies` on the lake flywheel.toml names, when it is in a bucket."""
    settings = lake_settings()
    if not settings.uses_s3:
        return WeightsDropped(0, 0)
    grace_hours = load_section(MaintenanceConfig, "maintenance").file_grace_hours
    con = open_lake(settings, read_only=True)
    try:
        return drop_local_copies(con, settings, grace_hours)
    finally:
        con.close()


def _inside(path: Path, home: Path) -> bool:
    return path.resolve().is_relative_to(home.resolve())


def _delete(folder: Path) -> int:
    if not folder.is_dir() or folder.is_symlink():
        return 0
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
    shutil.rmtree(folder)
    return size
