"""Lake maintenance deletes the weights of models nothing serves, when asked, and says so after."""
import os
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import append_rows, open_lake, transaction
from storage.objects import ObjectStore
from storage.schemas import SCHEMAS
from tasks.release.models import ModelNotFound, local_model_dir, publish_model
from tasks.release.promote import ModelError, promote
from tasks.release.retention import drop_local_copies, drop_old_weights

NOW = datetime(2026, 12, 20, tzinfo=timezone.utc)
DAY = 24 * 3600
CYCLES = {"c-old": ("completed", 10), "c-new": ("completed", 1), "c-failed": ("failed", 10),
          "c-running": ("running", 0)}  # status, days ago


def _folder(path, size: int = 1000):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"w" * size)
    return path


def _lake(settings, models):
    con = open_lake(settings)
    with transaction(con):
        append_rows(con, "models", pa.Table.from_pylist([
            {"policy_version": v, "parent_version": None, "uri": uri, "status": s, "reason": None,
             "created_at": NOW - timedelta(days=30), "cycle_id": c} for v, s, c, uri in models],
            schema=SCHEMAS["models"]))
        append_rows(con, "cycles", pa.Table.from_pylist([
            {"cycle_id": c, "started_at": NOW - timedelta(days=ago), "finished_at": NOW - timedelta(days=ago),
             "status": s, "snapshot_id": None, "stage_seconds": "{}", "stage_counts": "{}", "reason": None}
            for c, (s, ago) in CYCLES.items()], schema=SCHEMAS["cycles"]))
    return con


def test_old_rejected_and_passed_over_weights_go_and_their_rows_say_so(lake_settings, tmp_path, monkeypatch):
    jobs = lake_settings.home / "jobs"
    models = [(v, s, c, str(_folder(jobs / v / "model"))) for v, s, c in [
        ("rejected", "rejected", "c-old"), ("round-1", "candidate", "c-old"), ("prod", "production", "c-old"),
        ("retired", "retired", "c-old"), ("recent", "rejected", "c-new"), ("failed-cycle", "rejected", "c-failed")]]
    models.append(("users-own", "rejected", "c-old", str(_folder(tmp_path / "my-model"))))  # outside the home
    con = _lake(lake_settings, models)
    assert drop_old_weights(con, lake_settings, 0, NOW).models == 0  # 0 days: keep all
    dropped = drop_old_weights(con, lake_settings, 7, NOW)
    assert (dropped.models, dropped.bytes) == (2, 2 * (1000 + 2))
    assert sorted(p.parent.name for p in jobs.glob("*/model")) == ["failed-cycle", "prod", "recent", "retired"]
    assert (tmp_path / "my-model" / "model.safetensors").exists()
    marked = con.execute("SELECT policy_version FROM lake.models WHERE weights_deleted_at IS NOT NULL "
                         "ORDER BY 1").fetchall()
    assert marked == [("rejected",), ("round-1",)]
    with pytest.raises(ModelNotFound, match="were deleted by lake maintenance on 2026-12-20"):
        local_model_dir(lake_settings, con, "rejected")
    with pytest.raises(ModelError, match="weights of model 'round-1' were deleted"):
        promote(con, "round-1", "try it after all")
    assert con.execute("SELECT status FROM lake.models WHERE policy_version = 'prod'").fetchone() == ("production",)
    assert drop_old_weights(con, lake_settings, 7, NOW).models == 0  # done once
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    listed = " ".join(CliRunner().invoke(app, ["model", "list"]).output.split())
    assert listed.count("deleted 2026-12-20") == 2, listed  # `model list` says whose weights are gone (cells wrap)


def test_a_models_objects_in_the_bucket_go_with_its_local_copy(s3_lake_settings, tmp_path):
    store = ObjectStore(s3_lake_settings)
    store.ensure_bucket()
    exported = _folder(s3_lake_settings.home / "jobs" / "rejected" / "model")  # as the train stage left it
    uri = publish_model(s3_lake_settings, exported, "rejected")
    con = _lake(s3_lake_settings, [("rejected", "rejected", "c-old", uri)])
    cached = local_model_dir(s3_lake_settings, con, "rejected")  # a job downloaded it once
    assert (cached / "model.safetensors").exists()
    dropped = drop_old_weights(con, s3_lake_settings, 7, NOW)
    assert (dropped.models, dropped.bytes) == (1, 2 * (1000 + 2))
    assert list(store.list(s3_lake_settings.s3_bucket, "models/")) == []
    assert not cached.exists() and not exported.exists()


def test_on_a_bucket_lake_this_machines_copies_go_once_the_bucket_holds_them(s3_lake_settings):
    """Each round's export stayed on the trainer's disk for ever, though the bucket holds it."""
    settings = s3_lake_settings
    ObjectStore(settings).ensure_bucket()
    models, exports = [], {}
    for version, status, cycle in [("retired", "retired", "c-old"), ("rejected", "rejected", "c-new"),
                                   ("prod", "production", "c-old"), ("training", "candidate", "c-running"),
                                   ("half-uploaded", "candidate", "c-old")]:
        exports[version] = _folder(settings.home / "jobs" / version / "model")  # as the train stage left it
        models.append((version, status, cycle, publish_model(settings, exports[version], version)))
    store = ObjectStore(settings)
    store.client.remove_object(settings.s3_bucket, "models/half-uploaded/model.safetensors")  # an upload cut short
    con = _lake(settings, models)
    cached = local_model_dir(settings, con, "retired")  # a job downloaded it once
    assert drop_local_copies(con, settings).models == 0  # all made or handed out within the grace
    dropped = drop_local_copies(con, settings, now=time.time() + DAY)
    assert (dropped.models, dropped.bytes) == (2, 3 * (1000 + 2))  # retired: export and download
    assert {v for v, f in exports.items() if f.exists()} == {"prod", "training", "half-uploaded"}
    assert not cached.exists()
    again = local_model_dir(settings, con, "retired")  # what a job that needs it again does
    assert (again / "model.safetensors").read_bytes() == b"w" * 1000
    assert drop_local_copies(con, settings, now=time.time() + DAY).models == 1  # only that download, next time


def test_a_copy_handed_out_within_the_grace_is_kept_and_one_idle_past_it_goes(s3_lake_settings):
    """An on-demand evaluation loads a candidate the maintenance schedule would delete: the
    copy it was handed an hour ago stays; the same copy idle for a day goes."""
    settings = s3_lake_settings
    ObjectStore(settings).ensure_bucket()
    uri = publish_model(settings, _folder(settings.home / "src" / "v"), "cand")
    con = _lake(settings, [("cand", "candidate", "c-old", uri)])
    copy = local_model_dir(settings, con, "cand")
    hour_ago = time.time() - 3600
    os.utime(copy, (hour_ago, hour_ago))
    assert drop_local_copies(con, settings, grace_hours=24).models == 0 and copy.exists()
    assert local_model_dir(settings, con, "cand") == copy  # handed out again: the grace starts again
    assert copy.stat().st_mtime > hour_ago + 3000
    two_days_ago = time.time() - 2 * DAY
    os.utime(copy, (two_days_ago, two_days_ago))
    assert drop_local_copies(con, settings, grace_hours=24).models == 1 and not copy.exists()


def test_a_download_killed_midway_leaves_no_folder_that_looks_whole(s3_lake_settings, monkeypatch):
    """A worker preempted while downloading a model: config.json (listed first) was in, the
    weights not; the next job must download it again, not load a folder without weights."""
    settings = s3_lake_settings
    ObjectStore(settings).ensure_bucket()
    uri = publish_model(settings, _folder(settings.home / "src" / "v"), "cand")
    con = _lake(settings, [("cand", "candidate", "c-old", uri)])
    download = ObjectStore.download

    def killed(store, bucket, key, target):
        if key.endswith("model.safetensors"):
            raise KeyboardInterrupt  # the process stopped here
        return download(store, bucket, key, target)

    monkeypatch.setattr(ObjectStore, "download", killed)
    with pytest.raises(KeyboardInterrupt):
        local_model_dir(settings, con, "cand")
    monkeypatch.setattr(ObjectStore, "download", download)
    assert sorted(p.name for p in (settings.home / "models").iterdir()) == []
    again = local_model_dir(settings, con, "cand")
    assert (again / "model.safetensors").read_bytes() == b"w" * 1000
