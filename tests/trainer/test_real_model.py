"""The engines on a real instruct model (SmolLM2-135M-Instruct, BPE tokenizer, ChatML).

Sizes come from the model: its context, its chat template's end-of-turn token, each
domain's completion budget. Token fidelity: the trainer trains on exactly the token ids
vLLM sampled, the prompt ids are the chat template's own, and the trainer's
recomputed logprobs of those ids match vLLM's.
"""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from trainer.engine import EngineConfig, encode_prompts, generate_vllm, prompt_fits
from trainer.ds_train import load_policy
from trainer.grpo import GRPOConfig, score_rows
from trainer.model_facts import read_facts

pytestmark = pytest.mark.slow

PROMPTS = [
    [{"role": "user", "content": "What is 47 + 25?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Find the sum of 120 and 35."}],
    [{"role": "user", "content": "Write a Python function `add(a, b)` that returns a + b."}],
    [{"role": "user", "content": 'Return JSON {"name": string, "age": integer} for Ada, aged 36.'}],
]
DOMAINS = ["math", "math", "code", "json"]


def test_the_model_says_its_own_sizes_and_stop_token(smollm2):
    facts = read_facts(smollm2)
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    assert facts.context_length == 8192 and facts.parameters == 134_515_008
    assert tokenizer.convert_ids_to_tokens(list(facts.stop_token_ids)) == ["<|im_end|>"]
    assert "<|im_start|>" in facts.chat_template
    cfg = EngineConfig(max_model_len=512, max_tokens=64, max_tokens_by_domain={"code": 200}).for_model(smollm2)
    assert (cfg.max_model_len, cfg.dtype) == (512, "float32")
    long = [{"role": "user", "content": "add these numbers: " + " + ".join(["12345"] * 200)}]
    assert prompt_fits(smollm2, PROMPTS + [long], cfg, DOMAINS + ["math"]) == [True] * 4 + [False]


def test_prompt_ids_are_the_chat_templates_own(smollm2):
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    for messages, ids in zip(PROMPTS, encode_prompts(smollm2, PROMPTS), strict=True):
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected  # transformers 5: a dict
        assert ids == list(expected)


def test_trainer_recomputes_vllms_sampled_logprobs_on_the_same_ids(smollm2):
    cfg = EngineConfig(n=2, max_tokens=48, max_tokens_by_domain={"code": 96}, temperature=0.7, seed=3)
    samples, timing = generate_vllm(smollm2, PROMPTS, cfg, DOMAINS)
    stop = read_facts(smollm2).stop_token_ids[0]
    for s in samples:
        budget = cfg.budget(DOMAINS[s.prompt_idx])
        if s.finish_reason == "stop":
            assert s.token_ids[-1] == stop and stop not in s.token_ids[:-1]
        else:
            assert len(s.token_ids) == budget
    model, pad_id = load_policy(str(smollm2))
    rows = [{"prompt_token_ids": s.prompt_token_ids, "token_ids": s.token_ids, "logprobs": s.logprobs}
            for s in samples]
    recomputed = score_rows(model, rows, GRPOConfig(temperature=cfg.temperature), pad_id, "cpu")
    diffs = [abs(a - b) for s, r in zip(samples, recomputed, strict=True) for a, b in zip(s.logprobs, r, strict=True)]
    worst, mean = max(diffs), sum(diffs) / len(diffs)
    print(f"\nSmolLM2 token fidelity: {len(diffs)} sampled tokens, vLLM vs trainer logprobs: "
          f"max |diff| {worst:.2e}, mean {mean:.2e}; sampling {timing['tokens_per_s']:.0f} tokens/s")
    assert worst < 1e-3 and mean < 1e-4
