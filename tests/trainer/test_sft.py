"""The supervised part of a job: unsolved tasks learned from their reference solutions."""
from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.conftest import addition_prompt
from trainer.grpo import GRPOConfig
from trainer.job import TrainJob, read_metrics, write_job
from trainer.launch import run_training, start_training
from trainer.rollout_data import RolloutDataError
from trainer.sft import encode_sft, read_sft_rows

PROBLEMS = [(12, 30), (45, 11), (70, 7), (21, 21), (33, 44), (18, 27), (60, 25), (14, 59)]


def sft_file(path, model):
    rows = encode_sft(model, [addition_prompt(a, b) for a, b in PROBLEMS], [str(a + b) for a, b in PROBLEMS])
    path.write_text("".join(json.dumps({"task_id": f"add-{a}-{b}", **r}) + "\n"
                            for (a, b), r in zip(PROBLEMS, rows, strict=True)))
    return path


def all_failed_rollouts(path, model):
    """Every sample failed: GRPO has nothing here, only the references can teach."""
    rows = encode_sft(model, [addition_prompt(a, b) for a, b in PROBLEMS[:2]], ["x", "y"])
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "sample_idx": k, "prompt_token_ids": r["prompt_token_ids"],
                                        "token_ids": r["token_ids"], "logprobs": [-1.0] * len(r["token_ids"]),
                                        "reward": 0.0, "status": "wrong"}) + "\n"
                            for i, r in enumerate(rows) for k in range(2)))
    return path


@torch.no_grad()
def mean_nll(model_dir, rows) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    total, count = 0.0, 0
    for r in rows:
        ids = torch.tensor([r["prompt_token_ids"] + r["token_ids"]])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        p = len(r["prompt_token_ids"])
        targets = ids[0, p:]
        total -= float(logp[p - 1:].gather(1, targets[:, None]).sum())
        count += len(targets)
    return total / count


@pytest.mark.slow
def test_a_job_with_only_references_learns_them(tmp_path, tiny_model):
    sft = sft_file(tmp_path / "sft.jsonl", tiny_model)
    cfg = GRPOConfig(steps=30, sft_per_step=8, sft_coef=1.0, lr=3e-3, max_epochs=100.0, temperature=1.0,
                     checkpoint_every=30)
    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(all_failed_rollouts(tmp_path / "r.jsonl",
                                                                                         tiny_model)),
                                               cfg, sft_rows=str(sft)))
    trained = run_training(job, device="cpu")
    rows = read_sft_rows(sft)
    before, after = mean_nll(tiny_model, rows), mean_nll(trained, rows)
    print(f"reference NLL per token: {before:.3f} -> {after:.3f}")
    assert after < 0.5 * before  # measured: 4.47 -> 0.43
    metrics = read_metrics(job)
    assert len(metrics) == 30 and all(m["groups_kept"] == 0 and m["sft_tokens"] > 0 for m in metrics)
    assert metrics[-1]["sft_loss"] < 0.5 * metrics[0]["sft_loss"]


@pytest.mark.slow
def test_references_mix_into_a_two_rank_grpo_step(tmp_path, tiny_model, random_rollouts):
    sft = sft_file(tmp_path / "sft.jsonl", tiny_model)
    cfg = GRPOConfig(steps=2, groups_per_step=4, sft_per_step=3, checkpoint_every=2, kl_coef=0.05)
    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(random_rollouts), cfg, ref_model=str(tiny_model),
                                               sft_rows=str(sft)))
    run_training(job, n_procs=2, device="cpu")
    metrics = read_metrics(job)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["groups_kept"] > 0 and m["sft_tokens"] > 0 and m["kl_reference"] is True
        assert m["kl"] >= 0 and m["sft_loss"] > 0


def test_a_malformed_sft_file_fails_before_launch(tmp_path, tiny_model, random_rollouts):
    bad = tmp_path / "sft.jsonl"
    bad.write_text(json.dumps({"task_id": "t", "prompt_token_ids": [1, 2], "token_ids": []}) + "\n")
    write_job(tmp_path / "job", TrainJob(str(tiny_model), str(random_rollouts), sft_rows=str(bad)))
    with pytest.raises(RolloutDataError, match=r"SFT row 0: token_ids must be a non-empty list"):
        start_training(tmp_path / "job")
