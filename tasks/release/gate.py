"""The promotion gate: is the candidate really better than production?

A pure function of two per-item score tables (rows with `eval_set`, `item_id`,
`domain`, `score` = the item's pass rate over its G samples). Items are paired by
(eval_set, item_id); only items both models were scored on count, so a contaminated
item excluded for the candidate is excluded for production too. The `fresh-failures`
set is just more items: it counts alongside the registered sets.

Decision:
- a paired bootstrap over items (resample items with replacement, `resamples` times,
  one seeded numpy Generator, all resamples as one matrix product) gives the
  percentile confidence interval of mean(candidate - production);
- promoted only when its lower bound is above `min_gain` and no domain regresses:
  a domain regresses when its *point estimate* of the mean difference is below
  -`domain_tolerance`. The point estimate, not the CI's upper bound, on purpose:
  domains hold few items, so their intervals are wide and "the upper bound is below
  -tolerance" would almost never fire; promotion is the risky action, so a domain that
  visibly got worse blocks it. Each domain's interval is still reported.
Anything else is rejected, with a reason that names the number that failed.

Not here: reading or writing the lake (tasks.release.promote applies the decision).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GateConfig:
    """min_gain: the CI's lower bound of mean(candidate - production) must exceed this.
    domain_tolerance: largest drop of a domain's mean score allowed (a positive number).
    resamples: bootstrap resamples (>= 1000 for a stable 95% interval).
    confidence: two-sided level of the intervals.
    seed: seeds the bootstrap, so a decision is reproducible.
    """

    min_gain: float = 0.0
    domain_tolerance: float = 0.05
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if not -1.0 <= self.min_gain < 1.0:
            raise ValueError(f"min_gain is a difference of pass rates, in [-1, 1), got {self.min_gain}")
        if not 0.0 <= self.domain_tolerance <= 1.0:
            raise ValueError(f"domain_tolerance must be in [0, 1] (e.g. 0.05), got {self.domain_tolerance}")
        if self.resamples < 1000:
            raise ValueError(f"resamples must be >= 1000 for a stable interval, got {self.resamples}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), e.g. 0.95, got {self.confidence}")


@dataclass(frozen=True)
class DomainResult:
    domain: str
    items: int
    candidate: float
    production: float
    diff: float
    low: float
    high: float
    regressed: bool


@dataclass(frozen=True)
class GateDecision:
    promoted: bool
    reason: str
    items: int  # paired items
    unpaired: int  # items scored for only one of the two models (not counted)
    candidate: float
    production: float
    diff: float
    low: float
    high: float
    confidence: float
    domains: tuple[DomainResult, ...]

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "domains"}
        out["domains"] = [d.__dict__.copy() for d in self.domains]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "GateDecision":
        """Inverse of to_dict (decisions travel between Prefect tasks as plain dicts)."""
        return cls(**{**data, "domains": tuple(DomainResult(**d) for d in data["domains"])})


def _by_key(rows: Iterable[Mapping]) -> dict[tuple[str, str], tuple[str, float]]:
    out = {}
    for row in rows:
        key = (str(row["eval_set"]), str(row["item_id"]))
        if key in out:
            raise ValueError(f"item {key} appears twice in one score table")
        score = float(row["score"])
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"item {key}: score must be a pass rate in [0, 1], got {score}")
        out[key] = (str(row.get("domain") or "unknown"), score)
    return out


def resample_counts(n_items: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n_items) matrix: how often each item is drawn in each resample."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_items, size=(resamples, n_items))
    flat = (draws + np.arange(resamples)[:, None] * n_items).ravel()
    return np.bincount(flat, minlength=resamples * n_items).reshape(resamples, n_items).astype(np.float64)


def _interval(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return float(low), float(high)


def bootstrap_ci(values: np.ndarray | list[float], cfg: GateConfig) -> tuple[float, float]:
    """Percentile interval of the mean of `values` (items resampled with replacement)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return float("nan"), float("nan")
    counts = resample_counts(values.size, cfg.resamples, cfg.seed)
    return _interval(counts @ values / values.size, cfg.confidence)


def _domain_results(domains: np.ndarray, cand: np.ndarray, prod: np.ndarray, counts: np.ndarray,
                    cfg: GateConfig) -> tuple[DomainResult, ...]:
    diff = cand - prod
    out = []
    for domain in sorted(set(domains.tolist())):
        mask = domains == domain
        drawn = counts[:, mask].sum(axis=1)
        # a resample that drew no item of this domain says nothing about it
        boot = (counts[:, mask] @ diff[mask])[drawn > 0] / drawn[drawn > 0]
        low, high = _interval(boot, cfg.confidence)
        point = float(diff[mask].mean())
        out.append(DomainResult(domain, int(mask.sum()), float(cand[mask].mean()), float(prod[mask].mean()),
                                point, low, high, regressed=point < -cfg.domain_tolerance))
    return tuple(out)


def decide(candidate: Iterable[Mapping], production: Iterable[Mapping], cfg: GateConfig) -> GateDecision:
    """Promote or reject the candidate from per-item scores of both models."""
    cand_rows, prod_rows = _by_key(candidate), _by_key(production)
    keys = sorted(cand_rows.keys() & prod_rows.keys())
    unpaired = len(cand_rows.keys() ^ prod_rows.keys())
    if not keys:
        return GateDecision(False, "rejected: no evaluation item was scored for both models", 0, unpaired,
                            *([float("nan")] * 5), cfg.confidence, ())
    domains = np.array([cand_rows[k][0] for k in keys])
    cand = np.array([cand_rows[k][1] for k in keys])
    prod = np.array([prod_rows[k][1] for k in keys])
    diff = cand - prod
    counts = resample_counts(len(keys), cfg.resamples, cfg.seed)
    low, high = _interval(counts @ diff / len(keys), cfg.confidence)
    per_domain = _domain_results(domains, cand, prod, counts, cfg)
    point = float(diff.mean())
    level = f"{cfg.confidence:.0%} CI"
    gain = f"gain {point:+.3f} ({level} {low:+.3f}..{high:+.3f}) over {len(keys)} items"
    regressed = [d for d in per_domain if d.regressed]
    if low <= cfg.min_gain:
        reason = f"rejected: {gain}; the lower bound is not above min_gain {cfg.min_gain:+.3f}"
    elif regressed:
        worst = min(regressed, key=lambda d: d.diff)
        reason = (f"rejected: {gain}, but domain {worst.domain!r} regresses by {worst.diff:+.3f} "
                  f"(tolerance {cfg.domain_tolerance:.3f}, {worst.items} items)")
    else:
        reason = (f"promoted: {gain}; lower bound above min_gain {cfg.min_gain:+.3f}; "
                  f"no domain drops more than {cfg.domain_tolerance:.3f}")
    return GateDecision(reason.startswith("promoted"), reason, len(keys), unpaired, float(cand.mean()),
                        float(prod.mean()), point, low, high, cfg.confidence, per_domain)
