"""Fixtures for trainer tests: a tiny model folder and real rollouts sampled from it."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from trainer.engine import EngineConfig, generate
from flows.demo.tiny_model import init_model

# One thread per process: the machine's cores are shared by many processes, and torch's
# OpenMP threads slow ~40x once they outnumber the free cores. Subprocesses inherit it.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


def addition_prompt(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"What is {a}+{b}?"}]


def addition_reward(a: int, b: int, completion: str) -> float:
    """Exact-answer reward by plain string compare (the pipeline uses verifiers.registry)."""
    return float(completion.strip() == str(a + b))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return init_model(tmp_path_factory.mktemp("tiny") / "model")


def write_rollouts(path, samples, problems, reward_fn=addition_reward, statuses=None):
    """A rollouts file from engine samples; optional statuses override 'ok'/'wrong'."""
    with open(path, "w") as f:
        for k, s in enumerate(samples):
            a, b = problems[s.prompt_idx]
            reward = reward_fn(a, b, s.text)
            status = statuses[k] if statuses else ("ok" if reward else "wrong")
            f.write(json.dumps({"task_id": f"add-{a}-{b}", "sample_idx": s.sample_idx,
                                "prompt_token_ids": s.prompt_token_ids, "token_ids": s.token_ids,
                                "logprobs": s.logprobs, "reward": reward, "status": status}) + "\n")
    return path


@pytest.fixture(scope="session")
def random_rollouts(tiny_model, tmp_path_factory):
    """16 prompts x 4 samples from the untrained model, rewarded at random.

    A random policy never answers right; random rewards give every group a spread so
    the trainer has work to do (what it learns is irrelevant to these tests).
    """
    rng = random.Random(0)
    problems = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(16)]
    samples = generate(tiny_model, [addition_prompt(a, b) for a, b in problems],
                       EngineConfig(backend="transformers", n=4, max_tokens=6, seed=0))
    path = tmp_path_factory.mktemp("rollouts") / "rollouts.jsonl"
    return write_rollouts(path, samples, problems, reward_fn=lambda a, b, t: float(rng.random() < 0.5))


@torch.no_grad()
def score_tokens(model_dir: str | Path, prompt_ids: list[int], completion_ids: list[int],
                 temperature: float = 1.0) -> list[float]:
    """Logprob of each completion token under the model (the trainer's view of a sample)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()
