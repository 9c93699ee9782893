"""GRPO objective as small pure tensor functions; the training loop only calls them.

Variant: GRPO (Shao et al. 2024, DeepSeekMath) with the later fixes, each a switch:
- Advantages are group mean-centred rewards; dividing by the group std is optional
  (`scale_by_std=False` is Dr. GRPO, Liu et al. 2025, which removes the difficulty bias).
- Aggregation over tokens: `grpo` (mean per sequence, then over sequences, as in the
  paper), `dapo` (mean over all tokens of the batch, Yu et al. 2025) or `dr_grpo`
  (sum divided by a constant, max_tokens * n_seqs, so length carries no bias).
- PPO clipping with separate low/high epsilons ("clip-higher", DAPO).
- KL to a frozen reference via the k3 estimator, but its coefficient defaults to 0
  (DAPO, Dr. GRPO drop it); the paper puts it in the loss with beta = 0.04.
- Truncated importance sampling (TIS, Yao et al. 2025): vLLM samples with its own
  kernels, so its logprobs differ slightly from the trainer's; each token is weighted by
  min(pi_old / pi_vllm, C). In an overlapped cycle the sampling policy is also up to
  `max_staleness` versions older than pi_old, and the same weight corrects for that
  (the clip stays against pi_old, the policy trained from: decoupled PPO).
- Departures from the paper: no std scaling and no KL by default; invalid rollouts
  (verifier timeout or sandbox error) are masked out of the group statistics and the
  loss instead of being scored 0; zero-variance groups are dropped (dynamic sampling,
  DAPO; `GRPOConfig.dynamic_sampling=False` keeps them) without being resampled — the
  next rollout round refills the batch.
Not here: models, optimisers, batching, distributed reductions (see trainer.grpo).
"""

from __future__ import annotations

from typing import Literal

import torch

from verifiers.verdict import INFRA_STATUSES  # no judgement of the completion: out of advantages

LossAgg = Literal["grpo", "dapo", "dr_grpo"]


def valid_mask(statuses: list[str]) -> torch.Tensor:
    """True where the verdict is a real judgement of the completion."""
    return torch.tensor([s not in INFRA_STATUSES for s in statuses], dtype=torch.bool)


def group_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None,
                     scale_by_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """Advantage of each sample in its group: reward minus the group mean.

    rewards, valid: [n_groups, G]. Invalid samples are left out of the mean and std
    and get advantage 0. The std is the population std over valid samples.
    """
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    w = valid.to(rewards.dtype)
    count = w.sum(dim=1, keepdim=True).clamp(min=1)
    mean = (rewards * w).sum(dim=1, keepdim=True) / count
    centred = (rewards - mean) * w
    if scale_by_std:
        std = ((centred ** 2).sum(dim=1, keepdim=True) / count).sqrt()
        centred = centred / (std + eps)
    return centred


def keep_groups(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Dynamic sampling: a group is kept if its valid samples' rewards are not all equal.

    A group whose samples all score the same has zero advantages, hence no gradient,
    and would only dilute the batch. A group with fewer than two valid samples has no
    spread either. Returns a bool [n_groups].
    """
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    big = torch.finfo(rewards.dtype).max
    high = torch.where(valid, rewards, torch.full_like(rewards, -big)).max(dim=1).values
    low = torch.where(valid, rewards, torch.full_like(rewards, big)).min(dim=1).values
    return (valid.sum(dim=1) >= 2) & (high > low)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(d) - d - 1 with d = ref - logp (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                      eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO per-token loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A) and where it clipped.

    adv broadcasts over tokens ([n_seqs, 1]). The clipped mask marks tokens whose
    gradient the clip removed: r above 1+eps_high with A > 0, or below 1-eps_low with A < 0.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    is_clipped = ((ratio > 1 + eps_high) & (adv > 0)) | ((ratio < 1 - eps_low) & (adv < 0))
    return -torch.minimum(unclipped, clipped), is_clipped


def tis_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weight min(pi_old / pi_behaviour, cap), a constant (no grad)."""
    return torch.exp(old_logp - behaviour_logp).clamp(max=cap).detach()


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: LossAgg, max_tokens: int,
              total_tokens: float | None = None) -> torch.Tensor:
    """Reduce a [n_seqs, T] per-token loss to a scalar over mask (1 = completion token).

    total_tokens overrides the `dapo` denominator, so that data-parallel ranks holding
    different token counts still compute the global per-token mean between them.
    """
    m = mask.to(per_token.dtype)
    if mode == "grpo":
        per_seq = (per_token * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
        return per_seq.mean()
    if mode == "dapo":
        denom = m.sum().clamp(min=1) if total_tokens is None else total_tokens
        return (per_token * m).sum() / denom
    if mode == "dr_grpo":
        return (per_token * m).sum() / (max_tokens * per_token.shape[0])
    raise ValueError(f"unknown loss aggregation {mode!r}; use grpo, dapo or dr_grpo")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                adv: torch.Tensor, mask: torch.Tensor, *, mode: LossAgg, max_tokens: int,
                eps_low: float, eps_high: float, tis_cap: float | None,
                kl_coef: float = 0.0, ref_logp: torch.Tensor | None = None,
                total_tokens: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Full GRPO loss for one batch of [n_seqs, T] token logprobs; adv is [n_seqs].

    Returns the scalar loss and statistics (kl, clip_frac) over masked tokens.
    """
    per_token, is_clipped = clipped_surrogate(logp, old_logp, adv[:, None], eps_low, eps_high)
    if tis_cap is not None:
        per_token = per_token * tis_weights(old_logp, behaviour_logp, tis_cap)
    # Without a reference model the KL reported is to the rollout policy, which shows
    # how far this round's updates have moved it.
    kl_tok = k3_kl(logp, ref_logp if ref_logp is not None else old_logp)
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs reference logprobs (TrainJob.ref_model)")
        per_token = per_token + kl_coef * kl_tok
    loss = aggregate(per_token, mask, mode, max_tokens, total_tokens)
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)
    # 0-d tensors, not floats: reading a GPU value waits for the GPU (trainer.grpo reads
    # a step's statistics once, at its end)
    stats = {"kl": (kl_tok.detach() * m).sum() / n, "clip_frac": (is_clipped.to(m.dtype) * m).sum() / n}
    return loss, stats
