"""`flywheel model import`: a folder becomes a stored, recorded model; bad sources are
clear errors that change nothing. (The GGUF path runs in the `smollm2` fixture,
tests/conftest.py; the real model through the CLI in tests/flows/test_real_model_cycle.py.)"""
from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.demo.tiny_model import ModelConfig, init_model
from storage.lake import open_lake
from tasks.release.models import import_model, register_model
from trainer.model_import import ModelImportError


@pytest.fixture
def tiny(tmp_path):
    return init_model(tmp_path / "tiny")


def test_a_folder_is_stored_and_recorded_with_what_it_is(lake_settings, tiny):
    con = open_lake(lake_settings)
    version, new = import_model(con, lake_settings, str(tiny), "float32")
    row = con.execute("SELECT status, uri, source, sha256, parameters, context_length, chat_template "
                      "FROM lake.models").fetchall()
    assert new and len(row) == 1
    status, uri, source, sha, parameters, context, template = row[0]
    assert (status, source, context) == ("imported", str(tiny.resolve()), 512)
    assert uri == str(lake_settings.home / "models" / version) and len(sha) == 64
    assert 1_000_000 < parameters < 1_100_000 and "<|im_start|>" in template
    assert import_model(con, lake_settings, str(tiny), "float32") == (version, False)  # same weights: no change
    # register makes an imported model production (and keeps its one row)
    assert register_model(con, lake_settings, lake_settings.home / "models" / version, "start here") == version
    assert con.execute("SELECT status FROM lake.models").fetchall() == [("production",)]
    assert not list((lake_settings.home / "models").glob(".import-*"))
    # another folder registered: the one it supersedes says so, as a promotion's does
    other = init_model(tiny.parent / "other", ModelConfig(seed=1))
    newer = register_model(con, lake_settings, other, "a better start")
    assert dict(con.execute("SELECT status, reason FROM lake.models").fetchall()) == {
        "production": "a better start", "retired": f"manual: superseded by {newer}: a better start"}


def test_a_model_without_a_chat_template_is_refused(lake_settings, tiny):
    (tiny / "chat_template.jinja").unlink()
    con = open_lake(lake_settings)
    with pytest.raises(ModelImportError, match="has no chat template"):
        import_model(con, lake_settings, str(tiny), "float32")
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 0
    assert not list((lake_settings.home / "models").glob(".import-*"))  # no half-written folder left


@pytest.mark.parametrize("source, message", [
    ("no/such/folder", "expected a Hugging Face model folder"),
    ("llama3", "expected a Hugging Face model folder"),
])
def test_bad_sources_are_clear_errors(lake_settings, monkeypatch, source, message):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    result = CliRunner().invoke(app, ["model", "import", source])
    assert result.exit_code == 1 and message in " ".join(result.output.split())


def test_a_bad_dtype_is_a_clear_error(lake_settings, monkeypatch, tiny, tmp_path):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    copy = shutil.copytree(tiny, tmp_path / "copy")
    result = CliRunner().invoke(app, ["model", "import", str(copy), "--dtype", "int4"])
    assert result.exit_code == 1 and "dtype must be one of" in result.output


def _without_weights(tiny, tmp_path):
    for weights in tiny.glob("*.safetensors"):
        weights.unlink()
    return tiny


def _config_not_json(tiny, tmp_path):
    (tiny / "config.json").write_text("{not json")
    return tiny


def _junk_gguf(tiny, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"\x00" * 4096)
    return path


@pytest.mark.parametrize("break_source", [_without_weights, _config_not_json, _junk_gguf])
def test_a_source_transformers_cannot_load_is_a_clear_error_that_changes_nothing(
        lake_settings, monkeypatch, tiny, tmp_path, break_source):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    result = CliRunner().invoke(app, ["model", "import", str(break_source(tiny, tmp_path))])
    assert result.exit_code == 1, result.output
    assert "cannot load it as a model" in " ".join(result.output.split()) and "Traceback" not in result.output
    con = open_lake(lake_settings)
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 0
    assert not list((lake_settings.home / "models").glob(".import-*"))

