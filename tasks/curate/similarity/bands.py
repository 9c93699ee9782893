"""LSH buckets: which rows of a batch share a band key, vectorised.

`tasks.curate.similarity.minhash` computes one 64-bit key per (text, band); texts that share any band
key are candidate near duplicates. Per band, a hash-slot pass first sets aside the
rows whose key is unique (most of them), then an argsort buckets the rest; no dict
per row. A bucket pairs each member with at most `window` later members, so one huge
bucket (a common template) stays linear. What is *not* here: verification
(exact Jaccard) and clustering, which stay in `tasks.curate.similarity.minhash`.
"""
from __future__ import annotations

import numpy as np

_U64 = np.uint64


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique by sorting: numpy 2.3's default hash-based unique is several times slower
    on the large uint64 arrays this module builds."""
    ordered = np.sort(values)
    keep = np.ones(ordered.size, dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def _bucket_pairs(keys: np.ndarray, window: int) -> np.ndarray:
    """(m, 2) index pairs i < j sharing a key; each member pairs with up to `window`
    later members of its bucket (all pairs for buckets up to window + 1)."""
    n = keys.size
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    boundary = np.ones(n, dtype=bool)
    boundary[1:] = sorted_keys[1:] != sorted_keys[:-1]
    if boundary.all():
        return np.empty((0, 2), dtype=np.int64)
    run_start = np.flatnonzero(boundary)
    run_end = np.append(run_start[1:], n)
    ends = run_end[np.cumsum(boundary) - 1]
    counts = np.minimum(ends - np.arange(n) - 1, window)
    pos = np.flatnonzero(counts > 0)
    reps = np.repeat(pos, counts[pos])
    first = np.repeat(np.cumsum(counts[pos]) - counts[pos], counts[pos])
    later = reps + 1 + (np.arange(reps.size) - first)
    # a stable sort keeps equal keys in index order, so order[reps] < order[later]
    return np.stack([order[reps], order[later]], axis=1)


def _repeated_rows(keys: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rows whose key may occur in another row too, ascending: every row that shares its
    key, plus the few that merely share a hash slot (harmless: they end up in singleton
    buckets).

    Most keys of a band are unique, so this keeps the exact (argsort) bucketing to a
    small subset without sorting the whole band: every row writes its index into its
    slot; a row that does not read its own index back shares the slot, and so does the
    row that did. `slots` (int32, a power of two long) is scratch space reused across
    bands; `rows` is arange(len(keys)) as int32.
    """
    shift = _U64(64 - (slots.size.bit_length() - 1))
    slot = (keys >> shift).astype(np.intp)
    slots[slot] = rows  # one writer per slot survives, whichever it is
    winner = slots[slot]
    lost = np.flatnonzero(winner != rows)
    if lost.size == 0:
        return lost
    return sorted_unique(np.concatenate([lost, winner[lost]]))


def _scratch_slots(n: int) -> np.ndarray:
    # ~8 slots per row: about 1 row in 8 shares a slot by chance; at most 64 MiB, beyond
    # which more rows merely share slots (a larger exact subset, never a missed pair)
    return np.empty(1 << max(10, min(24, (8 * n).bit_length())), dtype=np.int32)


def candidate_pairs(keys: np.ndarray, window: int) -> np.ndarray:
    """Unique (i, j), i < j, pairs of rows of (n, bands) `keys` that share any band."""
    found = []
    slots, every = _scratch_slots(keys.shape[0]), np.arange(keys.shape[0], dtype=np.int32)
    for band in range(keys.shape[1]):
        rows = _repeated_rows(keys[:, band], slots, every)
        if rows.size:
            # rows ascend, so buckets keep index order and local i < j stays i < j
            found.append(rows[_bucket_pairs(keys[rows, band], window)])
    pairs = np.concatenate(found) if found else np.empty((0, 2), np.int64)
    if pairs.size == 0:
        return np.empty((0, 2), np.int64)
    n = np.int64(keys.shape[0])
    flat = sorted_unique(pairs[:, 0] * n + pairs[:, 1])
    return np.stack([flat // n, flat % n], axis=1)


def probe_pairs(new_keys: np.ndarray, old_keys: np.ndarray) -> np.ndarray:
    """Unique (new, old) pairs of rows of two batches that share any band."""
    found = []
    for band in range(new_keys.shape[1]):
        order = np.argsort(old_keys[:, band], kind="stable")
        sorted_old = old_keys[order, band]
        lo = np.searchsorted(sorted_old, new_keys[:, band], side="left")
        hi = np.searchsorted(sorted_old, new_keys[:, band], side="right")
        counts = hi - lo
        hit = np.flatnonzero(counts)
        if hit.size == 0:
            continue
        reps = np.repeat(hit, counts[hit])
        first = np.repeat(np.cumsum(counts[hit]) - counts[hit], counts[hit])
        found.append(np.stack([reps, order[np.repeat(lo[hit], counts[hit]) + np.arange(reps.size) - first]], 1))
    if not found:
        return np.empty((0, 2), dtype=np.int64)
    pairs = np.concatenate(found)
    width = np.int64(max(old_keys.shape[0], 1))
    flat = sorted_unique(pairs[:, 0] * width + pairs[:, 1])
    return np.stack([flat // width, flat % width], axis=1)
