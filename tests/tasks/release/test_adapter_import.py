"""`flywheel model import ADAPTER [--base BASE]`: a PEFT adapter is merged into its base and
stored as a plain folder; an adapter that does not fit its base is refused, nothing stored."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PromptTuningConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from flows.cli.app import app
from flows.demo.tiny_model import ModelConfig, init_model
from storage.lake import open_lake
from tasks.release.models import import_model
from trainer.model_import import ModelImportError

TARGETS = ["q_proj", "v_proj"]


def save_lora(base: Path, out: Path, targets=TARGETS, seed: int = 0) -> dict[str, torch.Tensor]:
    """A LoRA adapter of `base` as PEFT saves one, its B matrices non-zero (a freshly made
    adapter is the base itself); returns PEFT's own merge of it, the import's expected weights."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)),
                           LoraConfig(r=4, lora_alpha=8, target_modules=list(targets)))
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data = torch.randn(param.shape, generator=generator) * 0.5
    model.save_pretrained(str(out))
    return model.merge_and_unload().state_dict()


def _stored(settings, version: str) -> Path:
    return settings.home / "models" / version


def _models_left(settings) -> list[str]:
    root = settings.home / "models"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.fixture
def tiny(tmp_path):
    return init_model(tmp_path / "tiny")


def test_an_adapter_is_merged_into_the_base_its_config_names(lake_settings, tiny, tmp_path):
    expected = save_lora(tiny, tmp_path / "adapter")
    con = open_lake(lake_settings)
    version, new = import_model(con, lake_settings, str(tmp_path / "adapter"), "auto")
    stored = _stored(lake_settings, version)
    merged = load_file(str(stored / "model.safetensors"))
    base = load_file(str(tiny / "model.safetensors"))
    assert new and not list(stored.glob("adapter_*")), "a plain folder, as every model flywheel serves"
    changed = {k for k in base if not torch.equal(merged[k], base[k])}
    assert changed and all(k.split(".")[-2] in TARGETS for k in changed)
    assert all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in merged)
    status, parent, source, reason = con.execute(
        "SELECT status, parent_version, source, reason FROM lake.models").fetchone()
    assert (status, parent, source) == ("imported", None, str((tmp_path / "adapter").resolve()))
    assert reason == "imported from adapter adapter merged into tiny as float32"
    # the same adapter on the same base is the same model
    assert import_model(con, lake_settings, str(tmp_path / "adapter"), "auto") == (version, False)


def test_base_may_be_a_model_of_the_lake_which_becomes_the_parent(lake_settings, monkeypatch, tiny, tmp_path):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    con = open_lake(lake_settings)
    base_version, _ = import_model(con, lake_settings, str(tiny), "auto")
    con.close()
    expected = save_lora(tiny, tmp_path / "adapter")
    # the config names a hub id, as adapters trained on downloaded models do
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(app, ["model", "import", str(tmp_path / "adapter"), "--base", base_version])
    assert result.exit_code == 0, result.output
    con = open_lake(lake_settings, read_only=True)
    version, parent = con.execute("SELECT policy_version, parent_version FROM lake.models "
                                  "WHERE policy_version <> ?", [base_version]).fetchone()
    assert parent == base_version and version in result.output
    merged = load_file(str(_stored(lake_settings, version) / "model.safetensors"))
    assert all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in merged)


def test_an_adapter_of_a_hub_model_without_base_says_to_name_one(lake_settings, monkeypatch, tiny, tmp_path):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    save_lora(tiny, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "meta-llama/Llama-3.2-1B-Instruct"
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(app, ["model", "import", str(tmp_path / "adapter")])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in output, result.output
    assert "'meta-llama/Llama-3.2-1B-Instruct', which is no folder here" in output and "--base" in output
    assert _models_left(lake_settings) == []


def _adapter_of_another_size(tiny, tmp_path):
    other = init_model(tmp_path / "wide", ModelConfig(hidden_size=64, intermediate_size=256))
    save_lora(other, tmp_path / "adapter")
    return "does not fit the base model: Error(s) in loading state_dict"


def _adapter_of_absent_modules(tiny, tmp_path):
    save_lora(tiny, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["target_modules"] = ["query_key_value"]  # a Falcon/BLOOM adapter on a Llama base
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    return "does not fit the base model: Target modules"


def _adapter_whose_tensors_land_nowhere(tiny, tmp_path):
    save_lora(tiny, tmp_path / "adapter")
    path = tmp_path / "adapter" / "adapter_model.safetensors"
    weights = load_file(str(path))  # names of another wrapper: PEFT places none of them, and only warns
    save_file({k.replace("base_model.model.model.", "base_model.model.transformer."): v
               for k, v in weights.items()}, str(path))
    return "adapter tensors do not match the base model (first: "


def _prompt_tuning_adapter(tiny, tmp_path):
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny)),
                           PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    model.save_pretrained(str(tmp_path / "adapter"))
    return "PROMPT_TUNING adapter adds virtual tokens at run time and has no merged form"


def _adapter_config_no_object(tiny, tmp_path):
    save_lora(tiny, tmp_path / "adapter")
    (tmp_path / "adapter" / "adapter_config.json").write_text("[1, 2]")
    return "must be a JSON object, got a JSON list"


@pytest.mark.parametrize("make", [_adapter_of_another_size, _adapter_of_absent_modules,
                                  _adapter_whose_tensors_land_nowhere, _prompt_tuning_adapter,
                                  _adapter_config_no_object])
def test_an_adapter_that_does_not_fit_its_base_is_refused_and_nothing_stored(lake_settings, monkeypatch, tiny,
                                                                              tmp_path, make):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    message = make(tiny, tmp_path)
    result = CliRunner().invoke(app, ["model", "import", str(tmp_path / "adapter"), "--base", str(tiny)])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in output and message in output, result.output
    assert [m for m in _models_left(lake_settings) if not m.startswith(".")] == []
    assert not list((lake_settings.home / "models").glob(".import-*"))


def test_an_adapters_own_tokenizer_and_chat_template_win(lake_settings, tiny, tmp_path):
    """An adapter fine-tuned with a new chat template ships its tokenizer: the model is the
    merge served through that template, not the base's."""
    save_lora(tiny, tmp_path / "adapter")
    for name in ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "vocab.json"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, tmp_path / "adapter" / name)
    template = (tiny / "chat_template.jinja").read_text()
    (tmp_path / "adapter" / "chat_template.jinja").write_text("{# tuned #}" + template)
    con = open_lake(lake_settings)
    version, _ = import_model(con, lake_settings, str(tmp_path / "adapter"), "auto", base=str(tiny))
    stored = con.execute("SELECT chat_template FROM lake.models").fetchone()[0]
    assert stored.startswith("{# tuned #}")
    assert (_stored(lake_settings, version) / "chat_template.jinja").read_text().startswith("{# tuned #}")


def test_base_is_refused_for_a_whole_model(lake_settings, tiny):
    con = open_lake(lake_settings)
    with pytest.raises(ModelImportError, match="--base names the model a PEFT adapter was trained on"):
        import_model(con, lake_settings, str(tiny), "auto", base=str(tiny))
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 0


def test_a_lora_adapter_of_smollm2_imports_as_the_model_peft_serves(lake_settings, smollm2, tmp_path):
    """The real instruct model (tied embeddings, a BPE tokenizer, ChatML): the stored merge
    answers a chat prompt with the logits PEFT's unmerged adapter gives."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    save_lora(smollm2, tmp_path / "adapter", targets=["q_proj", "v_proj", "down_proj"], seed=3)
    con = open_lake(lake_settings)
    version, _ = import_model(con, lake_settings, str(tmp_path / "adapter"), "auto", base=str(smollm2))
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 47 + 25?"}],
                                         add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(_stored(lake_settings, version)))(ids).logits
        base = AutoModelForCausalLM.from_pretrained(str(smollm2))
        plain, count = base(ids).logits, sum(p.numel() for p in base.parameters())
        tuned = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))(ids).logits
    assert (tuned - plain).abs().max() > 1.0, "the adapter must change the model for the test to mean anything"
    assert (merged - tuned).abs().max() < 1e-3
    assert con.execute("SELECT parameters FROM lake.models").fetchone()[0] == count  # no adapter tensors left
