"""Scored rollouts as the trainer reads them: load, validate, group, pad.

A rollouts file (Parquet or JSON lines) has one row per sample with the columns of
`ROLLOUT_COLUMNS`: the prompt and completion token ids, the behaviour logprobs vLLM
returned for each completion token, the verifier's reward and status. Samples of one
task form a GRPO group. A malformed file raises `RolloutDataError` naming the row and
column at fault, before any model is loaded. Not here: the loss, reading the lake
(tasks/round/train.py exports a snapshot of the tables to this file).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch

from trainer.loss import group_advantages, keep_groups, valid_mask

ROLLOUT_COLUMNS = ("task_id", "sample_idx", "prompt_token_ids", "token_ids", "logprobs",
                   "reward", "status")


class RolloutDataError(ValueError):
    """The rollouts file cannot be trained on; the message says where and why."""


@dataclass(frozen=True)
class Groups:
    """Rollouts grouped by task, after dynamic sampling. Rows are sorted by (task, sample)."""

    rows: list[dict]            # kept samples, group after group
    group_slices: list[slice]   # rows of each kept group
    advantages: torch.Tensor    # [len(rows)], 0 for masked samples
    valid: torch.Tensor         # [len(rows)] bool: verdict is a real judgement
    groups_kept: int
    groups_dropped: int
    with_signal: int            # groups whose rewards differ (all kept ones, with dynamic sampling)


def read_rollouts(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise RolloutDataError(f"rollouts file {path} does not exist")
    try:
        if path.suffix == ".parquet":
            rows = pq.read_table(path).to_pylist()
        else:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except Exception as exc:  # any parse failure is reported as bad data, with its cause
        raise RolloutDataError(f"rollouts file {path} cannot be parsed: {exc}") from exc
    if not rows:
        raise RolloutDataError(f"rollouts file {path} has no rows")
    for i, row in enumerate(rows):
        check_row(i, row)
    return rows


def check_token_columns(label: str, row: dict, columns: tuple[str, ...]) -> None:
    """`row` has every column, and its prompt and completion ids are non-empty id lists;
    `label` names the row in the error ("rollout row 3", "SFT row 0")."""
    missing = [c for c in columns if row.get(c) is None]
    if missing:
        raise RolloutDataError(f"{label}: missing column(s) {missing}; need {list(columns)}")
    for col in ("prompt_token_ids", "token_ids"):
        ids = row[col]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise RolloutDataError(f"{label}: {col} must be a non-empty list of token ids")


def check_row(i: int, row: dict) -> None:
    check_token_columns(f"rollout row {i}", row, ROLLOUT_COLUMNS)
    if len(row["logprobs"]) != len(row["token_ids"]):
        raise RolloutDataError(f"rollout row {i}: {len(row['logprobs'])} logprobs for "
                               f"{len(row['token_ids'])} completion tokens; they must pair up")
    if not all(isinstance(x, (int, float)) and x <= 0 for x in row["logprobs"]):
        raise RolloutDataError(f"rollout row {i}: logprobs must be numbers <= 0")
    reward = row["reward"]
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise RolloutDataError(f"rollout row {i}: reward must be a finite number, got {reward!r}")


def group_rollouts(rows: list[dict], scale_by_std: bool, drop_uniform: bool = True) -> Groups:
    """Group by task, compute advantages, drop groups that carry no signal (unless
    `drop_uniform` is False: then they stay, with zero advantages, and count as kept)."""
    by_task: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: (str(r["task_id"]), r["sample_idx"])):
        by_task.setdefault(str(row["task_id"]), []).append(row)
    kept_rows: list[dict] = []
    slices, advs, valids = [], [], []
    dropped = with_signal = 0
    for task_id, group in by_task.items():
        if len({tuple(r["prompt_token_ids"]) for r in group}) != 1:
            raise RolloutDataError(f"task {task_id}: samples of one group have different prompts")
        rewards = torch.tensor([[float(r["reward"]) for r in group]], dtype=torch.float64)
        valid = valid_mask([r["status"] for r in group]).reshape(1, -1)
        signal = bool(keep_groups(rewards, valid)[0])
        with_signal += signal
        if drop_uniform and not signal:
            dropped += 1
            continue
        slices.append(slice(len(kept_rows), len(kept_rows) + len(group)))
        kept_rows.extend(group)
        advs.append(group_advantages(rewards, valid, scale_by_std)[0])
        valids.append(valid[0])
    return Groups(
        rows=kept_rows, group_slices=slices,
        advantages=torch.cat(advs).float() if advs else torch.zeros(0),
        valid=torch.cat(valids) if valids else torch.zeros(0, dtype=torch.bool),
        groups_kept=len(slices), groups_dropped=dropped, with_signal=with_signal)


def step_group_order(n_groups: int, groups_per_step: int, step: int, seed: int) -> list[int]:
    """Groups used by optimiser step `step` (0-based): a fixed function of (step, seed).

    Epoch e visits the groups in the order of a permutation seeded by (seed, e); steps
    take consecutive slices of the concatenated epochs. A resumed run therefore sees the
    same groups at the same steps as an uninterrupted one.
    """
    start = step * groups_per_step
    order: list[int] = []
    epoch = start // n_groups
    while len(order) < (start % n_groups) + groups_per_step:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order.extend(torch.randperm(n_groups, generator=gen).tolist())
        epoch += 1
    offset = start % n_groups
    return order[offset:offset + groups_per_step]


def pad_batch(rows: list[dict], pad_id: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion ids and completion-aligned tensors, the length
    rounded up to a multiple of `multiple`.

    Position t of the target tensors ([n, L-1]) holds the token at t+1, predicted by the
    logits at t; `mask` marks completion tokens, `behaviour_logp` holds vLLM's logprobs
    there.
    """
    length = padded_length(max(len(r["prompt_token_ids"]) + len(r["token_ids"]) for r in rows), multiple)
    n = len(rows)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length - 1), dtype=torch.bool)
    behaviour = torch.zeros((n, length - 1), dtype=torch.float32)
    for i, r in enumerate(rows):
        p, c = len(r["prompt_token_ids"]), len(r["token_ids"])
        input_ids[i, :p + c] = torch.tensor(r["prompt_token_ids"] + r["token_ids"])
        attention[i, :p + c] = 1
        mask[i, p - 1:p + c - 1] = True
        behaviour[i, p - 1:p + c - 1] = torch.tensor(r["logprobs"], dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention, "mask": mask, "behaviour_logp": behaviour}


def padded_length(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def batch_to(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """The batch on `device`. To a GPU through pinned memory, without waiting: a plain
    copy from pageable memory synchronises the stream, so the host could not queue the
    next kernels while the GPU works."""
    if torch.device(device).type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
