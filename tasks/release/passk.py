"""pass@k: the chance that at least one of k samples passes, estimated from n >= k samples.

The unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models
Trained on Code": with c of n samples correct, pass@k = 1 - C(n-c, k) / C(n, k).
The binomial coefficients overflow long before n gets interesting, so it is computed
as the product 1 - prod_{i=n-c+1}^{n} (1 - k / i) (their numerically stable form).
Per item, then averaged over items. pass@1 reduces to c / n, the mean pass rate.

Not here: which samples count. Callers drop samples the verifier could not judge
(timeouts, sandbox errors) before counting, since those say nothing about the model.
"""
from __future__ import annotations

import numpy as np


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
