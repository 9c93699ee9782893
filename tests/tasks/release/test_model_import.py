"""`flywheel model import`: a folder becomes a stored, recorded model; bad sources are
clear errors that change nothing. (The GGUF path runs in the `smollm2` fixture,
tests/conftest.py; the real model through the CLI in tests/flows/test_real_model_cycle.py.)"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from flows.cli.app import app
from flows.demo.tiny_model import ModelConfig, init_model
from storage.lake import open_lake
from tasks.release.models import ModelFolderError, import_model, register_model
from tests.trainer.chat_templates import NO_GENERATION_PROMPT
from tests.trainer.model_folders import without_stop_token
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


def _junk_gguf(tiny, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"\x00" * 4096)
    return path


# a config.json that is not JSON: test_a_config_that_is_no_json_object_is_one_line
@pytest.mark.parametrize("break_source", [_without_weights, _junk_gguf])
def test_a_source_transformers_cannot_load_is_a_clear_error_that_changes_nothing(
        lake_settings, monkeypatch, tiny, tmp_path, break_source):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    result = CliRunner().invoke(app, ["model", "import", str(break_source(tiny, tmp_path))])
    assert result.exit_code == 1, result.output
    assert "cannot load it as a model" in " ".join(result.output.split()) and "Traceback" not in result.output
    con = open_lake(lake_settings)
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 0
    assert not list((lake_settings.home / "models").glob(".import-*"))


def _models_left(settings) -> list[str]:
    """What an import left in FLYWHEEL_HOME/models (staging folders included)."""
    models = settings.home / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


@pytest.mark.parametrize("dtype", ["float32", "float16"])  # copied as it is / loaded and re-saved
def test_weights_cut_short_are_refused_not_imported(lake_settings, monkeypatch, tiny, dtype):
    """A copy of the weights that stopped half way: transformers' loader would fail on it in
    the first training job, so the import refuses it and stores nothing."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    weights = tiny / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = CliRunner().invoke(app, ["model", "import", str(tiny), "--dtype", dtype])
    output = " ".join(result.output.split())
    # rich folds a word longer than the 80 columns CliRunner gives it: pytest's tmp path is one
    assert result.exit_code == 1 and "model.safetensors" in "".join(output.split()), result.output
    assert "Traceback" not in output
    assert "truncated" in output or "incomplete" in output
    assert open_lake(lake_settings).execute("SELECT count(*) FROM lake.models").fetchone()[0] == 0
    assert _models_left(lake_settings) == []


def test_a_tokenizer_that_gives_no_stop_token_is_a_clear_error(lake_settings, monkeypatch, tiny):
    """No eos_token and a template that ends an assistant's turn with plain text: nothing
    would stop a completion, so the import says so (it used to fail on `stops[0]`)."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    without_stop_token(tiny)
    result = CliRunner().invoke(app, ["model", "import", str(tiny)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "no stop token" in output and "Traceback" not in output, result.output
    assert _models_left(lake_settings) == []


@pytest.mark.parametrize("source", ["HuggingFaceTB/SmolLM2-135M-Instruct", "s3://bucket/models/llama",
                                    "hf://meta-llama/Llama-3.2-1B-Instruct"])
def test_a_hub_id_or_url_says_flywheel_does_not_download(lake_settings, monkeypatch, source):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    result = CliRunner().invoke(app, ["model", "import", source])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "does not download" in output and "--local-dir" in output, result.output


@pytest.mark.parametrize("config, message", [("[]", "must be a JSON object, got a JSON list"),
                                             ('"llama"', "must be a JSON object, got a JSON str"),
                                             ("{oops", "is not JSON")])
def test_a_config_that_is_no_json_object_is_one_line(lake_settings, monkeypatch, tiny, config, message):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    (tiny / "config.json").write_text(config)
    result = CliRunner().invoke(app, ["model", "import", str(tiny)])
    output = " ".join(result.output.split())
    squeezed = "".join(output.split())  # rich folds a path longer than CliRunner's 80 columns
    assert result.exit_code == 1 and f"error:{tiny}/config.json{message.replace(' ', '')}" in squeezed, result.output
    assert _models_left(lake_settings) == []


def test_a_failure_after_conversion_leaves_no_folder_behind(lake_settings, tiny, monkeypatch):
    """Storing the converted folder fails (the bucket is unreachable): no row, and no folder
    under FLYWHEEL_HOME/models that a later import or a reader could take for a model."""
    import tasks.release.models as models

    def unreachable(*args):
        raise OSError("bucket unreachable")

    monkeypatch.setattr(models, "publish_model", unreachable)
    con = open_lake(lake_settings)
    with pytest.raises(OSError, match="bucket unreachable"):
        import_model(con, lake_settings, str(tiny), "float32")
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 0
    assert _models_left(lake_settings) == []


def test_weights_safetensors_cannot_read_are_a_clear_error(lake_settings, monkeypatch, tiny):
    """A whole file whose header names a dtype safetensors does not know: loading it (to
    re-save as float16) fails in safetensors, which is the user's input, not a traceback."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    weights = tiny / "model.safetensors"
    data = weights.read_bytes()
    assert b'"dtype":"F32"' in data
    weights.write_bytes(data.replace(b'"dtype":"F32"', b'"dtype":"Q32"'))
    result = CliRunner().invoke(app, ["model", "import", str(tiny), "--dtype", "float16"])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "cannot load it as a model" in output and "Traceback" not in output, result.output
    assert _models_left(lake_settings) == []


def test_registering_a_folder_with_broken_weights_is_refused(lake_settings, tiny):
    """`model register` stores no copy, so the folder's weights are checked where they are."""
    weights = tiny / "model.safetensors"
    data = weights.read_bytes()
    con = open_lake(lake_settings)
    for broken in (data[: len(data) // 2], b"\xff" * 64 + data[64:]):  # cut short; header garbled
        weights.write_bytes(broken)
        with pytest.raises(ModelFolderError, match="model.safetensors is (truncated|not a safetensors file)"):
            register_model(con, lake_settings, tiny, "start here")
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 0


def test_a_cloned_repository_is_stored_without_what_transformers_does_not_load(lake_settings, tiny, tmp_path):
    """`git clone` of a hub repository, or `huggingface-cli download --local-dir`, brings the
    git LFS objects, the download cache, Meta's `original/` checkpoint and Mistral's
    `consolidated.safetensors`: each the weights again. Only what a loader reads is stored."""
    con = open_lake(lake_settings)
    clean, _ = import_model(con, lake_settings, str(tiny), "float32")
    clone = shutil.copytree(tiny, tmp_path / "clone")
    weights = (tiny / "model.safetensors").read_bytes()
    for extra in (".git/lfs/objects/ab/cd/abcd", ".cache/huggingface/download/model.safetensors.metadata",
                  "original/consolidated.00.pth", "consolidated.safetensors", "pytorch_model.bin"):
        (clone / extra).parent.mkdir(parents=True, exist_ok=True)
        (clone / extra).write_bytes(weights)
    (clone / "LICENSE").write_text("Apache-2.0\n")
    version, new = import_model(con, lake_settings, str(clone), "float32")
    stored = sorted(p.name for p in (lake_settings.home / "models" / version).iterdir())
    expected = [p.name for p in (lake_settings.home / "models" / clean).iterdir()] + ["LICENSE"]
    assert new and stored == sorted(expected) and "model.safetensors" in stored
    assert len(set(con.execute("SELECT parameters FROM lake.models").fetchall())) == 1


def _save_beside_tiny_tokenizer(model, tiny, folder):
    model.save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, folder / name)
    return folder


def test_a_model_that_is_not_a_causal_lm_is_refused_before_it_is_stored(lake_settings, monkeypatch, tiny, tmp_path):
    """An encoder-decoder (T5) in float32 safetensors used to be copied as it is, then fail
    in `models` with a traceback; it is a user's input flywheel cannot train or serve."""
    from transformers import T5Config, T5ForConditionalGeneration

    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=102, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8))
    folder = _save_beside_tiny_tokenizer(t5, tiny, tmp_path / "t5")
    result = CliRunner().invoke(app, ["model", "import", str(folder)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "not a causal language model" in output and "(t5)" in output, result.output
    assert _models_left(lake_settings) == []


def test_a_model_whose_config_gives_no_context_length_is_a_clear_error(lake_settings, monkeypatch, tiny, tmp_path):
    """Mamba loads as a causal LM but its config has no max_position_embeddings."""
    from transformers import MambaConfig, MambaForCausalLM

    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    mamba = MambaForCausalLM(MambaConfig(vocab_size=102, hidden_size=16, state_size=4, num_hidden_layers=1))
    folder = _save_beside_tiny_tokenizer(mamba, tiny, tmp_path / "mamba")
    result = CliRunner().invoke(app, ["model", "import", str(folder)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "gives no context length" in output, result.output
    assert f"error:{folder}" in "".join(output.split()) and ".import-" not in output and "Traceback" not in output
    assert _models_left(lake_settings) == []


def test_a_quantized_folder_whose_library_is_missing_is_a_clear_error(lake_settings, monkeypatch, tiny):
    """GPTQ and AWQ checkpoints load only through libraries this install lacks; transformers
    says which by ImportError, which used to reach the user as a traceback."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    config = json.loads((tiny / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
    (tiny / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(app, ["model", "import", str(tiny)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "cannot load it as a model" in output and "GPTQ" in output, result.output
    assert _models_left(lake_settings) == []


def test_importing_an_imported_folder_again_changes_nothing(lake_settings, tiny):
    """The stored folder is a fixed point of the import: its own files come out byte for
    byte (generation_config.json's keys used to move), so it keeps its version."""
    generation = json.loads((tiny / "generation_config.json").read_text())
    del generation["pad_token_id"]  # as many releases ship it: the import adds the tokenizer's
    (tiny / "generation_config.json").write_text(json.dumps(generation))
    con = open_lake(lake_settings)
    version, _ = import_model(con, lake_settings, str(tiny), "float32")
    assert import_model(con, lake_settings, str(lake_settings.home / "models" / version), "float32") == (version, False)


def test_a_chat_template_that_cannot_render_a_turn_is_refused(lake_settings, monkeypatch, tiny):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    (tiny / "chat_template.jinja").write_text("{{ raise_exception('System message required') }}")
    result = CliRunner().invoke(app, ["model", "import", str(tiny)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "System message required" in output and "Traceback" not in output, result.output
    assert "cannot render a user and an assistant turn" in output and _models_left(lake_settings) == []


def test_a_chat_template_that_never_opens_the_assistants_turn_is_refused(lake_settings, tiny):
    (tiny / "chat_template.jinja").write_text(NO_GENERATION_PROMPT)
    con = open_lake(lake_settings)
    with pytest.raises(ModelImportError, match="ignores add_generation_prompt"):
        import_model(con, lake_settings, str(tiny), "float32")
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 0 and _models_left(lake_settings) == []


def test_importing_again_brings_back_a_stored_folder_that_was_deleted(lake_settings, tiny):
    """Its row still points at FLYWHEEL_HOME/models/<version> (a disk cleaned by hand): the
    same weights give the same bytes, so the import puts them back instead of saying
    nothing changed while jobs fail on a missing folder."""
    con = open_lake(lake_settings)
    version, _ = import_model(con, lake_settings, str(tiny), "float32")
    stored = lake_settings.home / "models" / version
    shutil.rmtree(stored)
    assert import_model(con, lake_settings, str(tiny), "float32") == (version, False)
    assert (stored / "config.json").exists() and _models_left(lake_settings) == [version]
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 1


def test_weights_that_do_not_fit_their_config_are_refused(lake_settings, monkeypatch, tiny):
    """A config.json from another size of the model (here a wider MLP): a copied folder is
    never loaded on import, so the shapes in its safetensors headers are checked against
    the model the config builds; loading it later would fail or build a different model."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    config = json.loads((tiny / "config.json").read_text())
    config["intermediate_size"] *= 2
    (tiny / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(app, ["model", "import", str(tiny)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "do not fit its config" in output and "mlp" in output, result.output
    assert _models_left(lake_settings) == []


def test_by_default_a_folder_keeps_its_dtype_and_its_weight_bytes(lake_settings, monkeypatch, tiny, tmp_path):
    """A bfloat16 model (most released ones) was loaded and stored as float32 unless the
    user said otherwise: twice its size on disk and in every upload, for nothing (the
    trainer keeps float32 master weights and the engines load at their own dtype)."""
    from transformers import AutoModelForCausalLM

    half = tmp_path / "bf16"
    shutil.copytree(tiny, half)
    AutoModelForCausalLM.from_pretrained(str(tiny)).to(torch.bfloat16).save_pretrained(str(half))
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    result = CliRunner().invoke(app, ["model", "import", str(half)])
    assert result.exit_code == 0, result.output
    version, reason = open_lake(lake_settings).execute("SELECT policy_version, reason FROM lake.models").fetchone()
    stored = lake_settings.home / "models" / version
    assert (stored / "model.safetensors").read_bytes() == (half / "model.safetensors").read_bytes()
    assert json.loads((stored / "config.json").read_text())["dtype"] == "bfloat16"
    assert reason == "imported from bf16 as bfloat16"


def test_two_imports_of_one_model_at_once_record_it_once(lake_settings, tiny, monkeypatch):
    """Two deploy jobs importing the same model: each finds no row before the other records
    one (the folder's move held long enough for both to get there), yet one row is kept."""
    import threading
    import time

    from tasks.release import models

    put_in_place = models._put_in_place
    monkeypatch.setattr(models, "_put_in_place", lambda staging, final: (time.sleep(1.0), put_in_place(staging, final)))
    results, errors = [], []

    def run() -> None:
        try:
            con = open_lake(lake_settings)
            results.append(import_model(con, lake_settings, str(tiny), "float32"))
            con.close()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    open_lake(lake_settings).close()  # the lake made first: the race here is the import's, not the catalog's
    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sorted(new for _, new in results) == [False, True] and len({v for v, _ in results}) == 1
    con = open_lake(lake_settings, read_only=True)
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 1
    assert (lake_settings.home / "models" / results[0][0] / "config.json").exists()
