"""What a model folder says about itself, on folders as users bring them: sharded
weights, a Mistral-style `consolidated.safetensors` beside the HF shards, weights cut
short by a failed copy, a tokenizer that gives no way to stop."""
from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoModelForCausalLM

from flows.demo.tiny_model import init_model
from tests.trainer.chat_templates import (GEMMA, GEMMA_TOKENS, LLAMA2, LLAMA3, LLAMA3_TOKENS, MISTRAL,
                                          NO_GENERATION_PROMPT, QWEN3, QWEN25, with_chat_template)
from tests.trainer.model_folders import without_stop_token
from trainer.model_facts import parameter_count, read_facts


@pytest.fixture
def tiny(tmp_path):
    return init_model(tmp_path / "tiny")


def _loaded_parameters(folder) -> int:
    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(str(folder)).parameters())


def test_parameters_are_those_of_the_weights_transformers_loads(tiny, tmp_path):
    expected = _loaded_parameters(tiny)
    assert parameter_count(tiny) == expected
    # Mistral's releases ship the original `consolidated.safetensors` beside the HF files;
    # transformers loads only model.safetensors (or the index's shards), so must the count.
    shutil.copy(tiny / "model.safetensors", tiny / "consolidated.safetensors")
    assert parameter_count(tiny) == expected
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(str(tiny)).save_pretrained(str(sharded), max_shard_size="1MB")
    shutil.copy(tiny / "model.safetensors", sharded / "consolidated.safetensors")
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    assert parameter_count(sharded) == expected


def test_weights_cut_short_or_garbled_are_a_clear_error(tiny):
    weights = tiny / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # a copy that stopped half way
    with pytest.raises(ValueError, match="model.safetensors is truncated"):
        parameter_count(tiny)
    weights.write_bytes(b"\xff" * 64 + data[64:])  # not a safetensors header at all
    with pytest.raises(ValueError, match="model.safetensors is not a safetensors file"):
        parameter_count(tiny)


def test_a_tokenizer_that_gives_no_stop_token_is_refused(tiny):
    """No eos and a template that writes no special token after an assistant's turn: every
    completion would run to its budget, so the folder is not one flywheel can use."""
    without_stop_token(tiny)
    with pytest.raises(ValueError, match="no stop token"):
        read_facts(tiny)


def test_the_default_of_named_chat_templates_is_the_recorded_template(tiny):
    """Hermes, Command-R and older Mistral releases list named templates ("default",
    "tool_use"); the chat endpoint renders "default", so that is the model's template."""
    template = (tiny / "chat_template.jinja").read_text()
    (tiny / "chat_template.jinja").unlink()
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": template},
                               {"name": "tool_use", "template": "{{ 'tools' }}" + template}]
    (tiny / "tokenizer_config.json").write_text(json.dumps(config))
    assert read_facts(tiny).chat_template == template


@pytest.mark.parametrize("template", [
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}",  # as Mistral's do
    "{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}",
])
def test_a_chat_template_that_cannot_render_a_turn_is_a_clear_error(tiny, template):
    (tiny / "chat_template.jinja").write_text(template)
    with pytest.raises(ValueError, match="chat template cannot render a user and an assistant turn"):
        read_facts(tiny)


def test_a_template_that_ignores_add_generation_prompt_is_refused(tiny):
    """Its prompts would end after the user's turn: the model would go on with that turn
    rather than answer, and every sample would be judged on it."""
    (tiny / "chat_template.jinja").write_text(NO_GENERATION_PROMPT)
    with pytest.raises(ValueError, match=r"ignores add_generation_prompt.*'<\|im_start\|>assistant\\n' is missing"):
        read_facts(tiny)


@pytest.mark.parametrize("template, tokens, stop", [
    (GEMMA, GEMMA_TOKENS, "<end_of_turn>"),
    (MISTRAL, (), "<|im_end|>"),  # no add_generation_prompt: its prompt ends at [/INST] anyway
    (LLAMA2, (), "<|im_end|>"),
    (LLAMA3, LLAMA3_TOKENS, "<|eot_id|>"),
    (QWEN25, (), "<|im_end|>"),
    (QWEN3, (), "<|im_end|>"),  # enable_thinking switches what its prompt ends with
])
def test_the_families_templates_are_read_with_their_end_of_turn(tiny, template, tokens, stop):
    from transformers import AutoTokenizer

    facts = read_facts(with_chat_template(tiny, template, tokens))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    assert stop in tokenizer.convert_ids_to_tokens(list(facts.stop_token_ids))
