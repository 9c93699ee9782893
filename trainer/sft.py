"""The supervised part of a training job: reference solutions of tasks no sample solved.

A GRPO group in which every sample failed has no advantage to follow, so those tasks
(the `sft` route, tasks/round/routing.py) are taught by their reference solution
instead, in the same DeepSpeed job: each optimiser step adds the mean token NLL of
`sft_per_step` reference completions, weighted by `sft_coef`, to the GRPO loss. Mixed
into one job rather than run as a second one: a second job pays another launch, model
load, checkpoint and export per round (measured in the architecture doc), and running
it before GRPO would move the policy away from the one that sampled the rollouts, so
every importance ratio would start off-policy.

An SFT file (Parquet or JSON lines) has one row per task: `task_id`, the prompt's token
ids (the same chat-template call the engine makes) and the reference completion's token
ids, ending with the template's end-of-turn token, so the model learns to stop.
The NLL is of the temperature-scaled distribution the rollouts are sampled from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import torch

from trainer.rollout_data import RolloutDataError, batch_to, check_token_columns, pad_batch, step_group_order

SFT_COLUMNS = ("task_id", "prompt_token_ids", "token_ids")


def encode_sft(model_dir: str | Path, prompts: list[list[dict]], completions: list[str],
               template_args: list[dict | None] | None = None) -> list[dict]:
    """Token ids of each (prompt, reference completion): the prompt through the model's chat
    template with its template arguments (as the engine encodes it), the completion plus the
    end-of-turn token."""
    from transformers import AutoTokenizer

    from trainer.engine import encode_prompts
    from trainer.model_facts import template_end_of_turn

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    end = template_end_of_turn(tokenizer)
    end = end if end is not None else tokenizer.eos_token_id
    prompt_ids = encode_prompts(Path(model_dir), prompts, template_args)
    return [{"prompt_token_ids": p, "token_ids": tokenizer(c, add_special_tokens=False)["input_ids"] + [end]}
            for p, c in zip(prompt_ids, completions, strict=True)]


def read_sft_rows(path: str | Path | None) -> list[dict]:
    """The job's SFT rows (none when the job has no SFT file); bad rows raise RolloutDataError."""
    if path is None:
        return []
    path = Path(path)
    if not path.exists():
        raise RolloutDataError(f"SFT file {path} does not exist")
    rows = (pq.read_table(path).to_pylist() if path.suffix == ".parquet"
            else [json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    for i, row in enumerate(rows):
        check_token_columns(f"SFT row {i}", row, SFT_COLUMNS)
        row["logprobs"] = [0.0] * len(row["token_ids"])  # pad_batch's shape; not used by the NLL
    return rows


def step_rows(n_rows: int, per_step: int, step: int, seed: int) -> list[int]:
    """The SFT rows of optimiser step `step`: a fixed function of (step, seed), so a resumed
    job sees the same rows at the same steps; epochs cycle when per_step exceeds the rows."""
    return step_group_order(n_rows, per_step, step, seed + 7919) if n_rows else []


def sft_pieces(rows: list[dict], step: int, cfg, rank: int, world: int, multiple: int) -> list[list[int]]:
    """This rank's SFT rows of the step (indices into rows), one list per piece."""
    from trainer.grpo import length_pieces

    mine = step_rows(len(rows), cfg.sft_per_step, step, cfg.seed)[rank::world]
    return [[mine[j] for j in piece] for piece in length_pieces([rows[i] for i in mine], cfg.micro_tokens, multiple)]


def sft_backward(engine, rows: list[dict], step: int, cfg, rank: int, world: int, pad_id: int,
                 device) -> tuple[float | torch.Tensor, dict]:
    """Back-propagate this rank's share of the step's SFT loss (scaled so DeepSpeed's mean
    over ranks gives sft_coef x the step's mean token NLL), piece by piece; returns the
    loss's value and the sums (nll, tokens); the values may be 0-d tensors on `device`."""
    from trainer.grpo import pad_multiple
    from trainer.logprobs import token_logprobs

    order = step_rows(len(rows), cfg.sft_per_step, step, cfg.seed)
    scale = cfg.sft_coef * world / max(float(sum(len(rows[i]["token_ids"]) for i in order)), 1.0)
    nll, tokens = 0.0, 0.0
    multiple = pad_multiple(cfg, device)
    for piece in sft_pieces(rows, step, cfg, rank, world, multiple):
        host = pad_batch([rows[i] for i in piece], pad_id, multiple)
        batch = batch_to(host, device)
        logp, _ = token_logprobs(engine, batch, cfg.temperature)
        piece_nll = -(logp * batch["mask"]).sum()
        engine.backward(piece_nll * scale)
        nll = nll + piece_nll.detach()  # a tensor: reading it would wait for the GPU
        tokens += float(host["mask"].sum())
    return nll * scale, {"sft_nll": nll, "sft_tokens": tokens}
