"""GRPO training loop under DeepSpeed: one job = one base model + one rollouts file.

The loop runs inside each process started by the `deepspeed` launcher (see
trainer.ds_train and trainer.launch). Each optimiser step takes `groups_per_step`
groups in an order fixed by (step, seed), splits their samples across the data-parallel
ranks, and calls the pure loss of trainer.loss; normalisers are computed from global
counts, so the result does not depend on the number of processes. Before the first
step the base policy's own logprobs of every sample are computed once (pi_old for the
PPO ratio and TIS), which also makes a resumed run see exactly the same targets.
Not here: sampling (trainer.engine), reading the lake (tasks/round/train.py), the launcher.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from trainer.logprobs import token_logprobs
from trainer.loss import LossAgg, policy_loss
from trainer.rollout_data import Groups, batch_to, pad_batch, padded_length, step_group_order
from trainer.sft import sft_backward


GRPO_SUMS = ("kl", "clip_frac", "entropy", "tokens", "all_tokens")  # what a step adds up over its tokens
# A logprob per completion token of each row; None for a row this rank does not train on
RowScores = list[list[float] | None]


@dataclass(frozen=True)
class GRPOConfig:
    """One training job's hyper-parameters (see trainer.loss for the variant)."""

    steps: int = 8                    # optimiser steps in this job (at most; see max_epochs)
    groups_per_step: int = 32         # prompts (groups of G samples) per step
    # Passes over the kept groups: the job stops after max_epochs * kept / groups_per_step
    # steps if that comes first. In the demo, 65 kept groups x 8 steps x 32 = 4 passes
    # over stale samples drove KL to 0.19 and gave a candidate worse than its parent.
    max_epochs: float = 2.0
    # Dynamic sampling (DAPO): groups whose rewards are all equal are dropped and the steps
    # are filled with groups that carry signal. False keeps them (zero advantage, no
    # gradient, but their tokens count in the dapo normaliser), as TRL's GRPOTrainer does.
    dynamic_sampling: bool = True
    # Measured on the tiny model (on-policy, 32 prompts x 8 a step): 1e-3 collapsed it
    # (25% -> 0.3%), 1e-4 drifted down, 3e-5 raised held-out pass@1 25% -> 31% in 50 steps.
    lr: float = 3e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    loss_agg: LossAgg = "dapo"
    scale_by_std: bool = False        # False = Dr. GRPO advantages
    eps_low: float = 0.2
    eps_high: float = 0.28            # > eps_low: clip-higher
    tis_cap: float | None = 2.0       # None disables truncated importance sampling
    kl_coef: float = 0.0              # > 0 needs a reference model in the job
    temperature: float = 1.0          # the sampling temperature of the rollouts
    max_tokens: int = 32              # the rollouts' max_tokens; dr_grpo's normaliser
    zero_stage: Literal[0, 1, 2, 3] = 2
    checkpoint_every: int = 4         # DeepSpeed checkpoint every K steps (and at the end)
    seed: int = 0
    forward_chunk: int = 256          # sequences per no-grad forward when scoring
    # Padded tokens per forward of a training step: the step's rows are sorted by length
    # and cut into pieces of at most this many (padded) tokens, so one long prompt does
    # not pad every row to its length. One 200-token word problem among 256 additions
    # of ~20 tokens made a CPU step 19-43 s instead of ~4 s. It also bounds a piece's
    # activations. Architectures outside trainer.logprobs.LINEAR_HEAD_MODELS also hold
    # about five float32 copies of the piece's logits (8 GB at 8192 tokens of a 49k
    # vocab). On an H200, 32768 ran Qwen2-0.5B 1.27x faster than 16384 (bench/gpu_train.py).
    micro_tokens: int = 8192
    # On a GPU, each piece's length is rounded up to a multiple of this: exact lengths
    # made nearly every piece of every step a new shape for the GPU's kernels (cuDNN
    # plans, matmul heuristics). Measured on an H200, Qwen2-1.5B: 34.6k tokens/s at 64
    # vs 28.1k at 1 (bench/gpu_train.py). Not on CPU, where padding is paid in full.
    gpu_pad_multiple: int = 64
    # LoRA (PEFT): 0 = full fine-tuning, the default, chosen by measurement on SmolLM2-135M
    # (2 CPU cores): one forward+backward+AdamW over 8 x 128 tokens in one process took
    # 7.3 s full, 4.1 s with LoRA r=16 on every projection; but a real 2-step ZeRO-2 job
    # on 2 ranks (a demo round's rollouts) took 208 s full vs 197 s LoRA (steps 81/57 s
    # vs 80/46 s), at a higher peak memory (22.4 vs 19.9 GiB); its checkpoints are 3.5x
    # smaller (0.57 vs 2.0 GiB). A 5% gain does not pay for an lr to retune (LoRA wants
    # ~10x) and a different learning dynamic; LoRA is for models whose optimiser state
    # does not fit. The exported candidate is merged: a plain folder vLLM loads.
    lora_rank: int = 0
    lora_alpha: float | None = None  # None: 2 x lora_rank
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    # The supervised part (trainer/sft.py): reference completions of tasks no sample
    # solved, sft_per_step of them per step, their mean token NLL weighted by sft_coef.
    sft_coef: float = 0.1
    sft_per_step: int = 8

    def __post_init__(self) -> None:
        if self.steps < 1 or self.groups_per_step < 1:
            raise ValueError("GRPOConfig.steps and groups_per_step must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"GRPOConfig.lr must be > 0, got {self.lr}")
        if self.loss_agg not in ("grpo", "dapo", "dr_grpo"):
            raise ValueError(f"GRPOConfig.loss_agg must be grpo, dapo or dr_grpo, got {self.loss_agg!r}")
        if not 0 <= self.eps_low < 1 or self.eps_high < 0:
            raise ValueError("GRPOConfig.eps_low must be in [0, 1) and eps_high >= 0")
        if self.tis_cap is not None and self.tis_cap < 1:
            raise ValueError("GRPOConfig.tis_cap must be >= 1 (or None to disable TIS)")
        if self.kl_coef < 0 or self.temperature <= 0 or self.max_tokens < 1:
            raise ValueError("GRPOConfig.kl_coef must be >= 0, temperature > 0, max_tokens >= 1")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"GRPOConfig.zero_stage must be 0-3, got {self.zero_stage}")
        if self.checkpoint_every < 1:
            raise ValueError("GRPOConfig.checkpoint_every must be >= 1")
        if self.micro_tokens < 1 or self.gpu_pad_multiple < 1:
            raise ValueError("GRPOConfig.micro_tokens and gpu_pad_multiple must be >= 1")
        if self.sft_coef < 0 or self.sft_per_step < 1:
            raise ValueError("GRPOConfig.sft_coef must be >= 0 and sft_per_step >= 1")
        if self.max_epochs <= 0:
            raise ValueError("GRPOConfig.max_epochs must be > 0 (passes over the kept groups)")
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))  # a JSON job gives a list
        if self.lora_rank < 0 or (self.lora_rank and not self.lora_targets):
            raise ValueError("GRPOConfig.lora_rank must be >= 0 (0: full fine-tuning), with lora_targets")
        if self.lora_rank and self.zero_stage == 3:
            raise ValueError("GRPOConfig.lora_rank needs zero_stage <= 2: the LoRA export merges the "
                             "adapters into the full weights each rank holds, which ZeRO-3 partitions")

    def steps_for(self, groups_kept: int, sft_rows: int = 0) -> int:
        """Optimiser steps a job with `groups_kept` groups and `sft_rows` SFT rows runs:
        `steps`, capped by max_epochs over whichever of the two needs more steps."""
        passes = max(groups_kept / self.groups_per_step, sft_rows / self.sft_per_step)
        return max(1, min(self.steps, math.ceil(self.max_epochs * passes)))


def deepspeed_config(cfg: GRPOConfig, micro_batch: int, world_size: int, on_gpu: bool) -> dict:
    """ZeRO config: bf16 on GPU; fp32 on CPU, where bf16 matmuls are slow and inexact."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch * world_size,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": on_gpu},
        # train_step back-propagates piece by piece and step() is the step's boundary
        # (ZeRO-2/3 still reduce inside each backward: train_step evens the ranks' counts)
        "managed_gradient_accumulation": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


@torch.no_grad()
def score_rows(model, rows: list[dict], cfg: GRPOConfig, pad_id: int, device) -> list[list[float]]:
    """The model's logprob of each completion token of each row, in length-sorted pieces
    of at most cfg.micro_tokens padded tokens (and cfg.forward_chunk rows)."""
    out: list[list[float]] = [[] for _ in rows]
    multiple = pad_multiple(cfg, device)
    for piece in length_pieces(rows, cfg.micro_tokens, multiple):
        for start in range(0, len(piece), cfg.forward_chunk):
            positions = piece[start:start + cfg.forward_chunk]
            chunk = [rows[i] for i in positions]
            batch = batch_to(pad_batch(chunk, pad_id, multiple), device)
            logp = token_logprobs(model, batch, cfg.temperature)[0].cpu()  # one transfer, not one per row
            for row, (i, r) in enumerate(zip(positions, chunk, strict=True)):
                p, c = len(r["prompt_token_ids"]), len(r["token_ids"])
                out[i] = logp[row, p - 1:p + c - 1].tolist()
    return out


def rank_rows(groups: Groups, step: int, cfg: GRPOConfig, rank: int, world: int) -> tuple[list[int], int]:
    """Indices (into groups.rows) this rank trains on at `step`, and the step's total."""
    order = step_group_order(groups.groups_kept, cfg.groups_per_step, step, cfg.seed)
    idx = [i for g in order for i in range(groups.group_slices[g].start, groups.group_slices[g].stop)]
    return idx[rank::world], len(idx)


def rows_trained(groups: Groups, steps: int, cfg: GRPOConfig, rank: int, world: int) -> list[int]:
    """Every row (index into groups.rows) this rank trains on in the job's `steps` steps:
    the rows whose pi_old it must score. The other ranks score theirs, and rows no step
    reaches are not scored at all."""
    if not groups.groups_kept:
        return []
    return sorted({i for step in range(steps) for i in rank_rows(groups, step, cfg, rank, world)[0]})


def train_step(engine, groups: Groups, old_logp: RowScores, ref_logp: RowScores | None,
               step: int, cfg: GRPOConfig, rank: int, world: int, pad_id: int,
               sft_rows: list[dict] = ()) -> dict[str, float]:
    """One optimiser step; returns this rank's sums, reduced across ranks by the caller.

    The rank's rows are cut into length-sorted pieces (`length_pieces`), each weighted to
    its share of the rank's loss and back-propagated as soon as it is computed: gradients
    add up to those of one padded batch, while memory holds one piece's activations and
    logits, not the step's (a whole step of 256 rows x 640 tokens ran out of an H200's
    141 GB even on a 135M model). The step's SFT rows (trainer/sft.py) add their pieces.
    ZeRO-2 reduces gradient buckets inside backward, so every rank must make the same
    number of backward passes: a rank with fewer pieces than another makes up the
    difference with zero-weighted passes (every rank counts every rank's pieces: the rows
    are shared), or the ranks' collectives fall out of step.
    """
    counts = step_pieces(groups, step, cfg, world, pad_multiple(cfg, engine.device), sft_rows)
    loss, sums = 0.0, dict.fromkeys(GRPO_SUMS, 0.0)
    if groups.groups_kept:
        loss, sums = grpo_backward(engine, groups, old_logp, ref_logp, step, cfg, rank, world, pad_id)
    sft_sums = {"sft_nll": 0.0, "sft_tokens": 0.0}
    if sft_rows:
        sft_part, sft_sums = sft_backward(engine, list(sft_rows), step, cfg, rank, world, pad_id, engine.device)
        loss = loss + sft_part
    for _ in range(max(1, *counts) - counts[rank]):
        # fewer pieces (or no row) here than on another rank: a zero gradient keeps this
        # rank's backward passes, and its optimiser state, in step with the others'
        engine.backward(sum(p.sum() for p in engine.module.parameters() if p.requires_grad) * 0.0)
    engine.step()
    # The step's figures were summed where they were computed (on a GPU, without waiting
    # for it) and are read only now, after the step's work is queued: the first read
    # waits for the GPU once, the rest are ready.
    out = {"loss": loss, **sums, **sft_sums}
    values = torch.stack([torch.as_tensor(v, dtype=torch.float64).to("cpu") for v in out.values()]).tolist()
    return {**dict(zip(out, values)), "loss": values[0] / world}


def grpo_backward(engine, groups: Groups, old_logp: RowScores, ref_logp: RowScores | None,
                  step: int, cfg: GRPOConfig, rank: int, world: int, pad_id: int) -> tuple[torch.Tensor, dict]:
    """Back-propagate this rank's GRPO loss for the step's groups, piece by piece; returns
    the loss's value and the sums (0-d tensors on the engine's device; all_tokens, known
    on the host, a float)."""
    all_idx, n_total = rank_rows(groups, step, cfg, 0, 1)
    total_tokens = float(sum(len(groups.rows[i]["token_ids"]) for i in all_idx if groups.valid[i]))
    loss, sums = 0.0, dict.fromkeys(GRPO_SUMS, 0.0)
    for piece_idx in grpo_pieces(groups, step, cfg, rank, world, pad_multiple(cfg, engine.device)):
        piece_loss, piece_sums = piece_loss_and_sums(engine, groups, old_logp, ref_logp, piece_idx, cfg,
                                                     pad_id, total_tokens / world)
        if cfg.loss_agg != "dapo":
            # dapo divides by the global token count already. The per-sequence means weigh
            # by rows, and DeepSpeed averages gradients over ranks: each rank's share.
            piece_loss = piece_loss * len(piece_idx) * world / n_total
        engine.backward(piece_loss)
        loss = loss + piece_loss.detach()
        sums = {k: sums[k] + piece_sums[k] for k in sums}
    return loss, sums


def step_pieces(groups: Groups, step: int, cfg: GRPOConfig, world: int, multiple: int,
                sft_rows=()) -> list[int]:
    """The backward passes each rank makes for this step's rows (GRPO and SFT pieces)."""
    from trainer.sft import sft_pieces

    return [len(grpo_pieces(groups, step, cfg, rank, world, multiple))
            + len(sft_pieces(list(sft_rows), step, cfg, rank, world, multiple)) for rank in range(world)]


def grpo_pieces(groups: Groups, step: int, cfg: GRPOConfig, rank: int, world: int,
                multiple: int) -> list[list[int]]:
    """This rank's GRPO rows of the step (indices into groups.rows), one list per piece."""
    if not groups.groups_kept:
        return []
    idx, _ = rank_rows(groups, step, cfg, rank, world)
    return [[idx[j] for j in piece]
            for piece in length_pieces([groups.rows[i] for i in idx], cfg.micro_tokens, multiple)]


def length_pieces(rows: list[dict], max_tokens: int, multiple: int = 1) -> list[list[int]]:
    """Positions of `rows`, sorted by length and cut so no piece pads past max_tokens
    (a row longer than that is a piece of its own); lengths round up to `multiple`."""
    lengths = [padded_length(len(r["prompt_token_ids"]) + len(r["token_ids"]), multiple) for r in rows]
    pieces: list[list[int]] = []
    for i in sorted(range(len(rows)), key=lengths.__getitem__):
        # sorted ascending, so the newest row is the piece's longest
        if pieces and (len(pieces[-1]) + 1) * lengths[i] <= max_tokens:
            pieces[-1].append(i)
        else:
            pieces.append([i])
    return pieces


def piece_loss_and_sums(engine, groups: Groups, old_logp: RowScores, ref_logp: RowScores | None,
                        idx: list[int], cfg: GRPOConfig, pad_id: int,
                        total_tokens: float) -> tuple[torch.Tensor, dict]:
    rows = [groups.rows[i] for i in idx]
    host = pad_batch(rows, pad_id, pad_multiple(cfg, engine.device))
    # spread on the host batch: the device mask would cost a device-to-host sync per row
    host["old_logp"] = spread(host["mask"], [old_logp[i] for i in idx])
    if ref_logp is not None:
        host["ref_logp"] = spread(host["mask"], [ref_logp[i] for i in idx])
    host["valid"], host["advantages"] = groups.valid[idx], groups.advantages[idx]
    batch = batch_to(host, engine.device)
    mask = batch["mask"] & batch["valid"][:, None]
    logp, entropy = token_logprobs(engine, batch, cfg.temperature, with_entropy=True)
    loss, stats = policy_loss(
        logp, batch["old_logp"], batch["behaviour_logp"], batch["advantages"], mask,
        mode=cfg.loss_agg, max_tokens=cfg.max_tokens, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
        tis_cap=cfg.tis_cap, kl_coef=cfg.kl_coef, ref_logp=batch.get("ref_logp"), total_tokens=total_tokens)
    n_tok = mask.sum()
    return loss, {"kl": stats["kl"] * n_tok, "clip_frac": stats["clip_frac"] * n_tok,
                  "entropy": (entropy * mask).sum(), "tokens": n_tok.double(),
                  "all_tokens": float(host["attention_mask"].sum())}


def pad_multiple(cfg: GRPOConfig, device) -> int:
    return cfg.gpu_pad_multiple if torch.device(device).type == "cuda" else 1


def spread(mask: torch.Tensor, values: list[list[float]]) -> torch.Tensor:
    """Place per-completion-token values at the mask's positions of a [n, L-1] tensor."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for i, vals in enumerate(values):
        out[i, mask[i]] = torch.tensor(vals, dtype=torch.float32)
    return out


def step_metrics(step: int, sums: dict[str, float], groups: Groups, cfg: GRPOConfig, seconds: float,
                 kl_reference: bool = False) -> dict:
    """One `train_steps` row (less policy_version/cycle_id, which the caller adds)."""
    idx, _ = rank_rows(groups, step, cfg, 0, 1) if groups.groups_kept else ([], 0)
    rewards = torch.tensor([float(groups.rows[i]["reward"]) for i in idx if groups.valid[i]])
    tok = max(sums["tokens"], 1.0)
    return {
        "step": step + 1, "loss": sums["loss"],
        "reward_mean": float(rewards.mean()) if len(rewards) else float("nan"),
        "reward_std": float(rewards.std(unbiased=False)) if len(rewards) else float("nan"),
        "kl": sums["kl"] / tok, "entropy": sums["entropy"] / tok, "clip_frac": sums["clip_frac"] / tok,
        "resp_len_mean": sum(len(groups.rows[i]["token_ids"]) for i in idx) / max(len(idx), 1),
        "groups_kept": groups.groups_kept, "groups_dropped": groups.groups_dropped,
        "tokens_per_s": (sums["all_tokens"] + sums.get("sft_tokens", 0.0)) / max(seconds, 1e-9), "step_s": seconds,
        "kl_reference": kl_reference,
        "sft_loss": sums["sft_nll"] / sums["sft_tokens"] if sums.get("sft_tokens") else None,
        "sft_tokens": int(sums.get("sft_tokens", 0)),
    }


def append_metrics(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def truncate_metrics(path: Path, last_step: int) -> None:
    """On resume, forget rows of steps after the checkpoint; they will be redone."""
    if path.exists():
        rows = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= last_step]
        path.write_text("".join(r + "\n" for r in rows))


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - t0
