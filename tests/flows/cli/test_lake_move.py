"""`flywheel lake move`: a laptop's lake, rows and model folders, becomes another lake (a bucket
with a PostgreSQL catalog, or another folder); what it refuses, it refuses before writing."""
from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import StagedRows, append_rows, open_lake, transaction
from storage.objects import ObjectStore
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.release.models import local_model_dir, register_model
from tests import services

runner = CliRunner()
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
ROWS = {  # tables of several kinds of column: lists, binary, uint64 lists, timestamps, JSON text
    "quarantine": [{"batch_id": "b1", "line_no": i, "raw": f"line {i}", "kind": "bad_json", "reason": "r",
                    "cycle_id": "c1"} for i in range(3)],
    "tasks": [{"task_id": "t1", "domain": "math", "prompt": "2+2?", "messages": "[]", "verifier": "math",
               "spec": '{"answer": "4"}', "source_log_ids": ["l1", "l2"], "created_at": NOW, "cycle_id": "c1"}],
    "task_bands": [{"task_id": "t1", "banding": "b16", "keys": [1, 2**63 + 5], "cycle_id": "c1"}],
    "minhash_signatures": [{"task_id": "t1", "scheme": "s", "signature": b"\x00\x01\xff", "cycle_id": "c1"}],
    "interactions": [{"completion_id": "x1", "gateway": "g", "seq": 1, "ts": NOW, "status": 200, "stream": False,
                      "failure_kinds": ["json"], "request": "{}", "response": "{}", "cycle_id": "c1"}],
    "cycles": [{"started_at": NOW, "finished_at": NOW, "status": "completed", "snapshot_id": 3,
                "stage_seconds": "{}", "stage_counts": "{}", "cycle_id": "c1"}],
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from flows.demo.tiny_model import init_model

    return init_model(tmp_path_factory.mktemp("tiny") / "model")


def _source_lake(settings: LakeSettings, model_dir: Path | None) -> str | None:
    """A lake written over several commits, with a registered model if given; its version."""
    con = open_lake(settings)
    for table, rows in ROWS.items():
        with transaction(con):
            append_rows(con, table, pa.Table.from_pylist(rows, schema=SCHEMAS[table]))
    version = model_dir and register_model(con, settings, model_dir, "the first production model")
    con.close()
    return version


def _rows(settings: LakeSettings) -> dict[str, list]:
    con = open_lake(settings, read_only=True)
    try:
        return {t: con.execute(f"SELECT * EXCLUDE (uri) FROM lake.{t} ORDER BY ALL" if t == "models" else
                               f"SELECT * FROM lake.{t} ORDER BY ALL").fetchall() for t in SCHEMAS}
    finally:
        con.close()


def _digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def _move(tmp_path, monkeypatch, source: LakeSettings, dest: dict, name: str = "dest.toml"):
    monkeypatch.setenv("FLYWHEEL_HOME", str(source.home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "absent.toml"))
    to = tmp_path / name
    to.write_text("[lake]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in dest.items()))
    return runner.invoke(app, ["lake", "move", "--to", str(to)])


def _snapshots(settings: LakeSettings) -> list[tuple]:
    con = open_lake(settings, read_only=True)
    try:
        return con.execute("SELECT snapshot_id, snapshot_time FROM ducklake_snapshots('lake')").fetchall()
    finally:
        con.close()


def _inserts(settings: LakeSettings) -> list[str]:
    """The commit messages of the snapshots that inserted rows."""
    con = open_lake(settings, read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT commit_message FROM ducklake_snapshots('lake') "
                                          "WHERE map_contains(changes, 'tables_inserted_into')").fetchall()]
    finally:
        con.close()


def test_a_local_lake_moves_to_a_bucket_with_a_postgres_catalog(tmp_path, monkeypatch, tiny_model, s3_server,
                                                                pg_dsn):
    source = LakeSettings(home=tmp_path / "laptop")
    version = _source_lake(source, tiny_model)
    before_rows, before_snapshots = _rows(source), _snapshots(source)
    catalog_bytes = (source.home / "catalog.sqlite").read_bytes()
    dest = {"home": str(tmp_path / "cluster"), "s3_endpoint": s3_server.endpoint,
            "s3_bucket": f"t-{uuid.uuid4().hex[:12]}", "s3_access_key": s3_server.access_key,
            "s3_secret_key": s3_server.secret_key,
            "catalog_dsn": services.create_database(pg_dsn, f"move_{uuid.uuid4().hex[:8]}")}
    result = _move(tmp_path, monkeypatch, source, dest)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "quarantine 3" in said and "tasks 1" in said and "models 1" in said, said
    assert "model folders: 1" in said and "history not kept" in said, said

    settings = LakeSettings(**{k: Path(v) if k == "home" else v for k, v in dest.items()})
    assert _rows(settings) == before_rows  # every table, every column but where the model is
    assert _inserts(settings) == [f"lake move of snapshot {len(before_snapshots) - 1} from {source.home.resolve()}"
                                  f"/data/ (catalog {source.home / 'catalog.sqlite'})"]  # one commit: no history
    con = open_lake(settings, read_only=True)
    uri = con.execute("SELECT uri FROM lake.models WHERE policy_version = ?", [version]).fetchone()[0]
    assert uri == f"s3://{dest['s3_bucket']}/models/{version}/"
    loaded = local_model_dir(settings, con, version)  # what a worker of the cluster does
    con.close()
    assert loaded.is_relative_to(settings.home) and _digests(loaded) == _digests(tiny_model)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(loaded).num_parameters() > 0
    # the source is a lake as it was: same rows, same snapshots, same catalog bytes
    assert (_rows(source), _snapshots(source)) == (before_rows, before_snapshots)
    assert (source.home / "catalog.sqlite").read_bytes() == catalog_bytes


def test_a_moved_lake_keeps_its_models_when_the_old_one_is_deleted(tmp_path, monkeypatch, tiny_model):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    for path in tiny_model.iterdir():
        (model_dir / path.name).write_bytes(path.read_bytes())
    source = LakeSettings(home=tmp_path / "old")
    version = _source_lake(source, model_dir)
    before = _rows(source)
    result = _move(tmp_path, monkeypatch, source, {"home": str(tmp_path / "new")})
    assert result.exit_code == 0, result.output
    dest = LakeSettings(home=tmp_path / "new")
    for path in model_dir.iterdir():  # the user deletes the old lake's folders once satisfied
        path.unlink()
    assert _rows(dest) == before
    with open_lake(dest, read_only=True) as con:
        moved = local_model_dir(dest, con, version)
    assert moved == (dest.home / "models" / version).resolve()
    assert _digests(moved) == _digests(tiny_model)


def test_a_move_stopped_before_its_commit_leaves_no_rows_and_runs_again(tmp_path, monkeypatch, tiny_model):
    source = LakeSettings(home=tmp_path / "old")
    _source_lake(source, tiny_model)
    dest = LakeSettings(home=tmp_path / "new")

    def cut(self):  # the connection to the catalog lost as the files were being added
        raise duckdb.IOException("connection reset")

    with monkeypatch.context() as patch:
        patch.setattr(StagedRows, "register", cut)
        stopped = _move(tmp_path, monkeypatch, source, {"home": str(dest.home)})
    assert stopped.exit_code == 1
    assert "the destination holds none of its rows" in stopped.output and "run the same command again" in \
        " ".join(stopped.output.split())
    assert all(rows == [] for rows in _rows(dest).values())  # nothing that looks moved
    again = _move(tmp_path, monkeypatch, source, {"home": str(dest.home)})
    assert again.exit_code == 0, again.output
    assert _rows(dest) == _rows(source)


def _refused(result, says: str) -> str:
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert said.startswith("error:") and says in said and said.count("error:") == 1, said
    return said


def _model_row(con, version: str, uri: str) -> None:
    with transaction(con):
        append_rows(con, "models", pa.Table.from_pylist([
            {"policy_version": version, "uri": uri, "status": "production", "created_at": NOW, "cycle_id": "setup"}],
            schema=SCHEMAS["models"]))


def test_a_destination_with_rows_is_refused_and_left_as_it_was(tmp_path, monkeypatch, tiny_model):
    source = LakeSettings(home=tmp_path / "old")
    _source_lake(source, None)
    with open_lake(source) as con:
        _model_row(con, "v1", str(tiny_model))
    dest = LakeSettings(home=tmp_path / "new")
    with open_lake(dest) as con, transaction(con):
        append_rows(con, "quarantine", pa.Table.from_pylist(ROWS["quarantine"][:1], schema=SCHEMAS["quarantine"]))
    before, snapshots = _rows(dest), _snapshots(dest)
    _refused(_move(tmp_path, monkeypatch, source, {"home": str(dest.home)}),
             "already holds a lake with rows (1 in quarantine): a move copies into an empty lake and merges nothing")
    assert (_rows(dest), _snapshots(dest)) == (before, snapshots)
    assert not (dest.home / "models").exists()


def test_no_source_the_same_lake_or_a_shared_home_is_refused_with_nothing_written(tmp_path, monkeypatch):
    source = LakeSettings(home=tmp_path / "old")
    _refused(_move(tmp_path, monkeypatch, source, {"home": str(tmp_path / "new")}), "nothing to move: no lake at")
    assert not (tmp_path / "new").exists()
    open_lake(source).close()
    _refused(_move(tmp_path, monkeypatch, source, {"home": str(source.home)}), "are the same lake")
    # a bucket lake sharing the laptop's home: its maintenance would delete the old lake's models
    _refused(_move(tmp_path, monkeypatch, source, {
        "home": str(source.home), "s3_endpoint": "127.0.0.1:9", "s3_access_key": "k", "s3_secret_key": "s",
        "catalog_dsn": "host=nowhere"}), "the destination's [lake] home is the source's")
    _refused(runner.invoke(app, ["lake", "move", "--to", str(_without_lake(tmp_path))]), "has no [lake] table")


def _without_lake(tmp_path: Path) -> Path:
    path = tmp_path / "no-lake.toml"
    path.write_text("[maintenance]\nmax_file_mb = 64\n")
    return path


def test_a_model_whose_folder_is_gone_stops_the_move_before_anything_is_written(tmp_path, monkeypatch):
    source = LakeSettings(home=tmp_path / "old")
    with open_lake(source) as con:
        _model_row(con, "v" * 64, str(tmp_path / "gone"))
    said = _refused(_move(tmp_path, monkeypatch, source, {"home": str(tmp_path / "new")}),
                    f"model vvvvvvvvvvvv's folder {tmp_path / 'gone'} is gone")
    assert "put the folder back" in said
    assert not (tmp_path / "new").exists()


def test_a_bucket_sources_models_are_copied_not_cached_in_its_home(tmp_path, monkeypatch, s3_lake_settings):
    """A model in the source's bucket is downloaded to the destination's home, never the source's."""
    source = s3_lake_settings
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w" * 1000)
    ObjectStore(source).ensure_bucket()
    from tasks.release.models import publish_model

    uri = publish_model(source, folder, "v1")
    with open_lake(source) as con:
        _model_row(con, "v1", uri)
    monkeypatch.setenv("FLYWHEEL_S3_ENDPOINT", source.s3_endpoint)
    monkeypatch.setenv("FLYWHEEL_S3_BUCKET", source.s3_bucket)
    monkeypatch.setenv("FLYWHEEL_S3_ACCESS_KEY", source.s3_access_key)
    monkeypatch.setenv("FLYWHEEL_S3_SECRET_KEY", source.s3_secret_key)
    result = _move(tmp_path, monkeypatch, source, {"home": str(tmp_path / "new")})
    assert result.exit_code == 0, result.output
    dest = LakeSettings(home=tmp_path / "new")
    with open_lake(dest, read_only=True) as con:
        assert con.execute("SELECT uri FROM lake.models").fetchone()[0] == str((dest.home / "models" / "v1").resolve())
    assert _digests(dest.home / "models" / "v1") == _digests(folder)
    assert not (source.home / "models").exists()
    assert sorted(p.name for p in dest.home.iterdir() if p.name.startswith(".move-")) == []
