"""pass@k: the chance that at least one of k samples passes, estimated from n >= k samples.

The unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models
Trained on Code": with c of n samples correct, pass@k = 1 - C(n-c, k) / C(n, k).
The binomial coefficients overflow long before n gets interesting, so it is computed
as the product 1 - prod_{i=n-c+1}^{n} (1 - k / i) (their numerically stable form).
Per item, then averaged over items. pass@1 reduces to c / n, the mean pass rate.

Which samples count is `item_scores`: samples the verifier could not judge (timeouts,
sandbox errors) say nothing about the model and are left out of n. The evaluate stage
(scoring its fresh samples) and the gate stage (reading `evaluations`) both count
through it.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from verifiers.verdict import INFRA_STATUSES


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one item with c correct out of n samples."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least k={k} samples per item and k >= 1, got n={n}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(n: np.ndarray | list[int], c: np.ndarray | list[int], k: int) -> float:
    """pass@k averaged over items (item i: c[i] correct of n[i] samples); nan with no items."""
    n, c = np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64)
    if n.shape != c.shape:
        raise ValueError(f"n and c must have the same shape, got {n.shape} and {c.shape}")
    if n.size == 0:
        return float("nan")
    return float(np.mean([pass_at_k(int(a), int(b), k) for a, b in zip(n, c)]))


def item_scores(samples: pl.DataFrame) -> list[dict]:
    """Per item (eval_set, item_id), in first-seen order: its domain, n judged samples,
    c passed, score = c / n (None when no sample was judged).

    `samples` has one row per sample: eval_set, item_id, domain, status, passed.
    """
    if samples.is_empty():
        return []
    judged = ~pl.col("status").is_in(sorted(INFRA_STATUSES))
    per_item = samples.group_by("eval_set", "item_id", maintain_order=True).agg(
        pl.col("domain").first(), judged.sum().cast(pl.Int64).alias("n"),
        (pl.col("passed") & judged).sum().cast(pl.Int64).alias("c"))
    return [{**row, "score": row["c"] / row["n"] if row["n"] else None} for row in per_item.to_dicts()]
