import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from flows.demo.tiny_model import ModelConfig, count_parameters, init_model


def test_init_builds_a_loadable_tiny_llama(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert model.config.model_type == "llama"
    assert 500_000 <= count_parameters(model) <= 2_000_000
    assert model.config.vocab_size == len(tok)
    assert (model.config.eos_token_id, model.config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    ids = tok("What is 1+2?", return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))


def test_init_is_reproducible(tmp_path, tiny_model):
    again = AutoModelForCausalLM.from_pretrained(init_model(tmp_path / "again"))
    first = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))


def test_config_validation_says_how_to_fix():
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        ModelConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="num_hidden_layers must be >= 1"):
        ModelConfig(num_hidden_layers=0)
