"""DeepSpeed ZeRO-2 GRPO on a real instruct model (SmolLM2-135M-Instruct), 2 CPU ranks.

The job is killed after its first checkpoint and resumed; it must finish every step from
the checkpoint and export a plain HF folder that differs from its parent, which vLLM
loads and samples. Peak memory of the two ranks together is measured and printed.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from trainer.ds_train import load_policy
from trainer.engine import EngineConfig, encode_prompts, generate_vllm
from trainer.grpo import GRPOConfig, score_rows
from trainer.job import TrainJob, read_metrics, write_job
from trainer.launch import release_shared_memory, start_training, wait_training

pytestmark = pytest.mark.slow

SUMS = [(2, 3), (4, 5), (7, 1), (6, 2), (3, 3), (8, 4), (9, 9), (11, 2)]
TEMPERATURE = 0.7


def rollouts_file(model_dir, path):
    """4 replies per sum, 2 right and 2 wrong, as ChatML turns ending in <|im_end|>; the
    behaviour logprobs are the model's own (an on-policy job)."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = encode_prompts(model_dir, [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in SUMS])
    rows = []
    for (a, b), prompt_ids in zip(SUMS, prompts, strict=True):
        replies = [(f"{a} + {b} = {a + b}.", 1.0), (f"{a} + {b} = {a + b + 1}.", 0.0),
                   (f"The sum of {a} and {b} is {a + b}.", 1.0), (f"The sum of {a} and {b} is {a * b + 3}.", 0.0)]
        for k, (text, reward) in enumerate(replies):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [end]
            rows.append({"task_id": f"add-{a}-{b}", "sample_idx": k, "prompt_token_ids": prompt_ids,
                         "token_ids": ids, "logprobs": [0.0] * len(ids), "reward": reward,
                         "status": "ok" if reward else "wrong"})
    model, pad_id = load_policy(str(model_dir))
    for row, logps in zip(rows, score_rows(model, rows, GRPOConfig(temperature=TEMPERATURE), pad_id, "cpu"),
                          strict=True):
        row["logprobs"] = logps
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tree_rss(proc: subprocess.Popen) -> int:
    """Resident memory of a launcher and every process under it, in bytes."""
    try:
        parent = psutil.Process(proc.pid)
        return sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])
    except psutil.Error:
        return 0


def test_zero2_on_two_ranks_killed_after_a_checkpoint_resumes_and_exports(smollm2, tmp_path):
    cfg = GRPOConfig(steps=2, groups_per_step=4, checkpoint_every=1, lr=1e-5, temperature=TEMPERATURE,
                     max_tokens=32, zero_stage=2)
    job = write_job(tmp_path / "job", TrainJob(str(smollm2), str(rollouts_file(smollm2, tmp_path / "r.jsonl")), cfg))
    proc = start_training(job, n_procs=2, device="cpu")
    peak, deadline = 0, time.monotonic() + 600
    while not (job / "checkpoints" / "latest").exists() or not read_metrics(job):
        assert proc.poll() is None, (job / "train.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint after step 1"
        peak = max(peak, tree_rss(proc))
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    release_shared_memory(proc)
    assert not (job / "model").exists() and [m["step"] for m in read_metrics(job)] == [1]

    resumed = start_training(job, n_procs=2, device="cpu")
    while resumed.poll() is None:
        peak = max(peak, tree_rss(resumed))
        time.sleep(0.2)
    exported = wait_training(resumed, job, timeout_s=600)
    assert "resuming from checkpoint step_" in (job / "train.log").read_text()
    assert [m["step"] for m in read_metrics(job)] == [1, 2]
    new, old = load_file(str(exported / "model.safetensors")), load_file(str(smollm2 / "model.safetensors"))
    assert set(new) == set(old) and any(not torch.equal(new[k], old[k]) for k in old)
    steps = read_metrics(job)
    print(f"\nSmolLM2 ZeRO-2, 2 CPU ranks: peak resident memory {peak / 2**30:.2f} GiB (both ranks and the "
          f"launcher); step seconds {[round(m['step_s'], 1) for m in steps]}; "
          f"tokens/s {[round(m['tokens_per_s']) for m in steps]}")
    samples, _ = generate_vllm(exported, [[{"role": "user", "content": "What is 2 + 3?"}]],
                               EngineConfig(n=2, max_tokens=24, temperature=TEMPERATURE))
    assert len(samples) == 2 and all(s.token_ids for s in samples)
