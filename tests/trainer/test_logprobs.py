"""The chunked head (trainer/logprobs.py) against the full model's logits."""
import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

import trainer.logprobs as logprobs
from trainer.logprobs import full_logit_logprobs, linear_head, token_logprobs
from trainer.rollout_data import pad_batch, read_rollouts


def logprobs_and_grads(model, batch, temperature, chunked: bool):
    model.zero_grad()
    fn = token_logprobs if chunked else full_logit_logprobs
    logp, entropy = fn(model, batch, temperature, with_entropy=True)
    # a loss that weighs tokens unequally, as the policy loss does
    weights = torch.linspace(-1.0, 2.0, logp.numel()).reshape(logp.shape)
    (logp * weights * batch["mask"]).sum().backward()
    return logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_chunked_head_has_the_logprobs_entropy_and_gradients_of_the_full_logits(
        tiny_model, random_rollouts, monkeypatch, temperature):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 7 * 64)  # several chunks, a ragged last one
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert linear_head(model) is model.lm_head  # the tiny model is a Llama: the chunked path
    batch = pad_batch(read_rollouts(random_rollouts)[:9], pad_id=0, multiple=8)
    chunked = logprobs_and_grads(model, batch, temperature, chunked=True)
    full = logprobs_and_grads(model, batch, temperature, chunked=False)
    assert int(batch["mask"].sum()) > 7  # more completion tokens than one chunk holds
    torch.testing.assert_close(chunked[0], full[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked[1], full[1], atol=1e-4, rtol=0)
    assert chunked[2].keys() == full[2].keys()
    for name, grad in full[2].items():
        torch.testing.assert_close(chunked[2][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    head = next(n for n, p in model.named_parameters() if p is model.lm_head.weight)  # tied: the embedding
    assert full[2][head].abs().max() > 1e-3  # the comparison is not of zeros


def test_a_real_architecture_with_a_plain_head_takes_the_chunked_path():
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=97)
    model = Qwen2ForCausalLM(config)
    assert linear_head(model) is model.lm_head
    ids = torch.randint(0, 97, (2, 10))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "mask": torch.zeros(2, 9, dtype=torch.bool).index_fill_(1, torch.arange(4, 9), True)}
    with torch.no_grad():
        chunked, _ = token_logprobs(model, batch, 1.0)
        full, _ = full_logit_logprobs(model, batch, 1.0, with_entropy=False)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=0)
    assert chunked[:, :4].abs().max() == 0  # prompt positions carry no logprob


def test_other_architectures_take_the_full_logits():
    # GPT-2 is not in LINEAR_HEAD_MODELS: an unknown head may scale or cap its logits
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=97))
    assert linear_head(model) is None


def test_right_padded_rows_score_as_they_do_alone(tiny_model, random_rollouts):
    """No attention mask is passed: a row's logprobs must not depend on the pads after it."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    rows = read_rollouts(random_rollouts)[:6]
    batch = pad_batch(rows, pad_id=0, multiple=16)
    with torch.no_grad():
        together, _ = token_logprobs(model, batch, 1.0)
        for i, row in enumerate(rows):
            alone = pad_batch([row], pad_id=0)
            logp, _ = token_logprobs(model, alone, 1.0)
            torch.testing.assert_close(together[i][batch["mask"][i]], logp[0][alone["mask"][0]], atol=1e-5, rtol=0)
    assert batch["input_ids"].shape[1] > min(len(r["prompt_token_ids"]) + len(r["token_ids"]) for r in rows)
