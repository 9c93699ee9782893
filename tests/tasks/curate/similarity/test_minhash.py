"""MinHash signatures, banding and near-duplicate clusters (tasks/curate/similarity/minhash.py)."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks.curate.similarity import minhash
from tasks.curate.similarity.normalize import tokenize_batch

ROOT = Path(__file__).resolve().parents[4]
CFG = minhash.MinHashConfig()


def _shingles(texts, cfg=CFG):
    return minhash.shingle_batch(tokenize_batch(texts), cfg.ngram)


def _pairs_at(similarity: float, count: int, size: int = 200, seed: int = 0) -> list[str]:
    """`count` pairs of texts whose unigram shingle sets have exactly this Jaccard."""
    rng = np.random.default_rng(seed)
    shared = round(size * 2 * similarity / (1 + similarity))
    texts = []
    for _ in range(count):
        words = [f"w{x}" for x in rng.choice(10**7, size=2 * size - shared, replace=False)]
        texts += [" ".join(words[:size]), " ".join(words[:shared] + words[size:])]
    return texts


def test_banding_is_the_best_feasible_one():
    bands, rows = CFG.banding
    assert bands * rows <= CFG.num_perm
    assert minhash.collision_probability(CFG.fp_similarity, bands, rows) <= CFG.max_false_positive
    best_missed = 1 - minhash.collision_probability(CFG.threshold, bands, rows)
    assert best_missed < 0.01
    for r in range(1, CFG.num_perm + 1):
        b = CFG.num_perm // r
        if minhash.collision_probability(CFG.fp_similarity, b, r) <= CFG.max_false_positive:
            assert 1 - minhash.collision_probability(CFG.threshold, b, r) >= best_missed


def test_impossible_false_positive_bound_is_refused():
    with pytest.raises(ValueError, match="max_false_positive"):
        minhash.MinHashConfig(num_perm=8, max_false_positive=0.0001, fp_similarity=0.7)


def test_signatures_estimate_jaccard_and_bands_collide_as_the_s_curve_says():
    cfg = minhash.MinHashConfig(ngram=1)
    texts = _pairs_at(cfg.threshold, 400)
    sketches = minhash.sketch_texts(texts, cfg)
    sigs, keys = sketches.signatures, sketches.keys
    agree = (sigs[0::2] == sigs[1::2]).mean()
    assert abs(agree - cfg.threshold) < 0.01  # unbiased estimate of Jaccard 0.8
    collide = (keys[0::2] == keys[1::2]).any(axis=1).mean()
    assert collide >= 0.98  # S-curve at the threshold: 0.998
    far = minhash.sketch_texts(_pairs_at(0.2, 400, seed=1), cfg).keys
    assert (far[0::2] == far[1::2]).any(axis=1).mean() < 0.03  # S-curve at 0.2: 0.0013


def test_exact_jaccard_matches_python_sets():
    texts = ["a b c d e f", "a b c d e g", "x y", "", "a b c d e f"]
    sh = minhash.shingle_batch(tokenize_batch(texts), 1)
    pairs = np.array([[0, 1], [0, 2], [3, 3], [0, 4]])
    assert minhash.exact_jaccard(sh, sh, pairs).tolist() == pytest.approx([5 / 7, 0.0, 0.0, 1.0])


def test_sketches_do_not_depend_on_chunking():
    texts = [f"prompt number {i} asks about {i % 7} apples and {i % 5} pears" for i in range(25)]
    one = minhash.sketch_texts(texts, CFG, chunk=1000)
    for chunk in (1, 4):
        other = minhash.sketch_texts(texts, CFG, chunk=chunk)
        assert np.array_equal(one.signatures, other.signatures)
        assert np.array_equal(one.shingles.hashes, other.shingles.hashes)


def test_signatures_are_stable_across_processes():
    code = ("import json; from tasks.curate.similarity import minhash;"
            "c = minhash.MinHashConfig();"
            "s = minhash.sketch_texts(['What is 17*23? Show the steps.', 'short'], c);"
            "print(json.dumps(s.signatures.tolist()))")
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                           capture_output=True, text=True).stdout for _ in range(2)]
    assert runs[0] == runs[1]
    here = minhash.sketch_texts(["What is 17*23? Show the steps.", "short"], CFG).signatures
    assert json.loads(runs[0]) == here.tolist()


def test_signatures_do_not_change_between_versions():
    # rows of minhash_signatures written by earlier cycles must keep comparing
    texts = ["What is 17*23? Show the steps.", "short", "", "a b a b a b"]
    sketches = minhash.sketch_texts(texts, CFG)
    assert sketches.signatures[:2, :3].tolist() == [[258958449, 445557669, 67503727],
                                                    [4051101297, 280020687, 3392238925]]
    assert hashlib.sha256(sketches.signatures.astype("<u4").tobytes()).hexdigest() == (
        "525d5c564ce59b70b1723c63bd80c27775ee217dfd97b0dc35909198a385f4b0")
    assert hashlib.sha256(sketches.keys.astype("<u8").tobytes()).hexdigest() == (
        "2997d824b59bbd8f874185cd1a0a51f072d07b5e8f87077ba8b28a7d7c7a9f8a")
    assert np.array_equal(minhash.band_keys(sketches.signatures, CFG), sketches.keys)


def _reference_candidates(keys: np.ndarray, window: int) -> set[tuple[int, int]]:
    """Per band, bucket rows by key in index order; each pairs with its next `window` members."""
    out = set()
    for band in range(keys.shape[1]):
        buckets: dict[int, list[int]] = {}
        for row, key in enumerate(keys[:, band].tolist()):
            buckets.setdefault(key, []).append(row)
        for rows in buckets.values():
            out |= {(i, j) for p, i in enumerate(rows) for j in rows[p + 1:p + 1 + window]}
    return out


def test_candidate_pairs_match_plain_bucketing():
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 2**63, size=(3000, 4), dtype=np.uint64)
    keys[rng.integers(0, 3000, 400), 0] = keys[rng.integers(0, 3000, 400), 0]  # scattered repeats
    keys[::7, 1] = 42  # one bucket far larger than the window
    keys[:, 2] = rng.integers(0, 50, 3000)  # every row in some bucket
    cfg = minhash.MinHashConfig(max_group_pairs=5)
    got = minhash.candidate_pairs(keys, cfg)
    assert np.all(got[:, 0] < got[:, 1]) and len({tuple(p) for p in got.tolist()}) == len(got)
    assert {tuple(p) for p in got.tolist()} == _reference_candidates(keys, 5)


def test_exact_jaccard_counts_sets_not_repeats():
    sh = minhash.shingle_batch(tokenize_batch(["a a b", "a b", "a b b c", ""]), 1)
    pairs = np.array([[0, 1], [0, 2], [2, 2], [3, 0]])
    assert minhash.exact_jaccard(sh, sh, pairs).tolist() == pytest.approx([1.0, 2 / 3, 1.0, 0.0])
