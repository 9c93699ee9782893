"""`flywheel demo --model smollm2`: the same loop on a real instruct model, on CPU.

The model is imported (`flywheel model import`: the SmolLM2-135M-Instruct GGUF that
`make` installs, or any HF folder or .gguf) and made production; no SFT warm-up. It
serves the demo's production traffic, answering in sentences and prose-wrapped code,
and its failures go through the same cycles as the tiny model's.

Sized for a budget of 45 minutes on 2 CPU cores (measured: 32:45 and 38:06, 2026-12-05), from what was measured
here on SmolLM2 (vLLM on CPU, ~200 sampled tokens/s; a ZeRO-2 GRPO step over ~32
samples 45-90 s on 2 ranks):
- 400 requests per serve: the failure rate's 95% interval is about +/-5 points;
- completion budgets per domain: a sentence for a sum, a function, a JSON object;
- one round of 32 tasks x 4 samples and 8 GRPO steps per cycle, full fine-tuning
  (not LoRA: measured, docs/architecture.md "Real models");
- evaluation on 30 items per evaluation set, 2 samples each.
"""
from __future__ import annotations

from dataclasses import replace

from flows.demo.simulate import TrafficConfig

# Sentences for a sum, room for a function or an object and a line of prose around it.
BUDGETS = {"math": 96, "code": 256, "json": 160}

_TOML_TEMPLATE = """\
[cycle.rollout]
tasks_per_round = 32
[cycle.rollout.engine]
n = 4
temperature = 0.7
max_tokens = 96
max_tokens_by_domain = {budgets}
max_model_len = 1024

[cycle.train]
n_procs = 2  # DeepSpeed ZeRO-2 over 2 CPU ranks

[cycle.train.grpo]
temperature = 0.7   # the rollouts' temperature
max_tokens = 256    # the longest budget: dr_grpo's normaliser
groups_per_step = 8
# A piece's float32 logits are 2048 x 49,152 x 4 B = 0.4 GB a copy, and the loss holds about
# five: at 8192 two CPU ranks beside the warm vLLM engine peaked at 22.9 of 24 GB
micro_tokens = 2048
lr = 5e-6
checkpoint_every = 4

[cycle.evaluate]
k = 2

[cycle.evaluate.engine]
n = 2
temperature = 0.3   # production's serving temperature (TrafficConfig)
max_tokens = 96
max_tokens_by_domain = {budgets}
max_model_len = 1024
"""
REAL_TOML = _TOML_TEMPLATE.replace(
    "{budgets}", "{ " + ", ".join(f"{domain} = {tokens}" for domain, tokens in BUDGETS.items()) + " }")


def real_model_settings(demo, model: str):
    """The demo's config for a real model: the tiny model's, resized as the module doc says."""
    return replace(demo, model=model, toml=REAL_TOML, cycles=2, rounds=1, tasks_per_round=32,
                   samples_per_task=4, train_steps=8, eval_samples=2, eval_items_per_set=30,
                   traffic=TrafficConfig(requests=400, math_share=0.8, max_tokens=96,
                                         max_tokens_by_domain=dict(BUDGETS)))
