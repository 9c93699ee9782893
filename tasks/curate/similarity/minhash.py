"""MinHash signatures, LSH banding and near-duplicate clusters, vectorised over a batch.

Shingles are word n-grams (default bigrams) of the strong-normalised tokens
(`tasks.curate.similarity.normalize`). Why words, and why two: prompts are short (10-100 words). With
n-gram shingles one substituted word removes n shingles and adds n, so Jaccard falls
to (L-2n+1)/(L+1) for an L-word prompt; trigrams drop below 0.8 after one edit in
anything under 29 words, bigrams hold down to 19 words. Unigrams would tolerate even
shorter prompts but ignore word order, so "17 - 23" and "23 - 17" or two templated
prompts differing in one slot would merge. Character n-grams tolerate edits like
unigrams while keeping order, but make one shingle per character (5-6x the work of
word shingles for the same prompt). Texts shorter than n words get one shingle: the
whole token sequence.

Permutations are universal hashes h(x) = (a*x + b) mod 2^32 (odd a) on the 32-bit
shingle hashes, ordered by the whole word, computed on uint32 lanes. Why not the
textbook mod a prime: with p = 2^61 - 1 the product a*x only fits uint64 when a is
small, and then h is almost monotone in x, so every permutation orders shingles nearly
alike (measured here: bands collided for 97% of pairs at Jaccard 0.8 instead of the
99.8% the S-curve promises); a full-width a needs 128-bit products numpy lacks. Why
32 bits: numpy multiplies uint32 with SIMD but emulates uint64 products, so this is
about twice as fast as a 64-bit multiply-add, and the inputs are already strong
hashes, so the multiplier scrambles their order; the tests check that agreement rates
and band collisions follow J and the S-curve. a and b come from blake2b of the seed,
so signatures from any process, any year, compare.

Candidates from banding (`tasks.curate.similarity.bands`) are always verified by exact Jaccard on the
shingle sets (not the signature estimate), so a merge never rests on estimator noise;
banding only has to make true pairs collide, which is what `choose_banding` optimises.

Signatures are computed as (num_perm, texts) rows: one multiply, one add and one
min-reduceat per step of a few thousand shingles. The scheme (`MinHashConfig.scheme`)
is fixed bit for bit: `minhash_signatures` rows of earlier cycles keep comparing, and
tests pin the values.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from tasks.curate.similarity import bands as lsh
from tasks.curate.similarity.normalize import TokenBatch, mix64, tokenize_batch

_U64 = np.uint64
_BAND_MIX = 0xD6E8FEB86659FD93
_STEP_SHINGLES = 8192  # shingles per vectorised step: num_perm x 8192 uint32 = 4 MiB


def collision_probability(similarity: float, bands: int, rows: int) -> float:
    """P(two sets of this Jaccard share at least one band): the S-curve 1-(1-s^r)^b."""
    return 1.0 - (1.0 - similarity**rows) ** bands


def choose_banding(
    threshold: float, num_perm: int, fp_similarity: float, max_false_positive: float,
) -> tuple[int, int]:
    """(bands, rows) with the fewest missed pairs at `threshold`, among the bandings
    whose candidate rate at `fp_similarity` is at most `max_false_positive`.

    For each row count r the most bands that fit (num_perm // r) is best: more bands
    only raise recall. The bound keeps dissimilar pairs from flooding verification.
    """
    best: tuple[float, int, int] | None = None
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if collision_probability(fp_similarity, bands, rows) > max_false_positive:
            continue
        missed = 1.0 - collision_probability(threshold, bands, rows)
        if best is None or missed < best[0]:
            best = (missed, bands, rows)
    if best is None:
        raise ValueError(
            f"no banding of {num_perm} permutations keeps P(candidate | J={fp_similarity}) "
            f"<= {max_false_positive}; raise max_false_positive or lower fp_similarity")
    return best[1], best[2]


@dataclass(frozen=True)
class MinHashConfig:
    """threshold: Jaccard at or above which two prompts are near duplicates.
    num_perm: permutations per signature (signature length).
    ngram: words per shingle.
    seed: derives the permutations; signatures only compare under the same seed.
    fp_similarity / max_false_positive: banding may make pairs of Jaccard
      fp_similarity candidates with at most this probability.
    max_group_pairs: a band bucket pairs each member with at most this many later
      members, so a huge bucket (a common template) stays linear.
    """

    threshold: float = 0.8
    num_perm: int = 128
    ngram: int = 2
    seed: int = 1
    fp_similarity: float = 0.5
    max_false_positive: float = 0.3
    max_group_pairs: int = 32

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 < self.fp_similarity < self.threshold:
            raise ValueError("fp_similarity must be in (0, threshold); it is the similarity "
                             f"banding should mostly ignore, got {self.fp_similarity}")
        if self.num_perm < 8 or self.ngram < 1 or self.max_group_pairs < 1:
            raise ValueError("num_perm must be >= 8, ngram >= 1 and max_group_pairs >= 1")
        self.banding  # noqa: B018 - raises now if no banding satisfies the bound

    @property
    def banding(self) -> tuple[int, int]:
        return choose_banding(self.threshold, self.num_perm, self.fp_similarity,
                              self.max_false_positive)

    @property
    def scheme(self) -> str:
        """What a persisted signature depends on; signatures of another scheme never compare."""
        return f"minhash-v1:words{self.ngram}:perm{self.num_perm}:seed{self.seed}"

    @property
    def banding_scheme(self) -> str:
        """What a persisted band key depends on: the signature's scheme and the banding
        (which the threshold and the false-positive bound choose)."""
        bands, rows = self.banding
        return f"{self.scheme}:bands{bands}x{rows}"


@dataclass(frozen=True)
class Shingles:
    """Shingle hashes of a batch, grouped by text: hashes[offsets[d]:offsets[d+1]]."""

    hashes: np.ndarray  # uint32: the top 32 bits of each shingle's 64-bit hash
    offsets: np.ndarray  # int64, n_texts + 1

    @property
    def count(self) -> int:
        return self.offsets.size - 1

    @staticmethod
    def concat(parts: list[Shingles]) -> Shingles:
        hashes = np.concatenate([p.hashes for p in parts])
        offsets = np.empty(sum(p.count for p in parts) + 1, dtype=np.int64)
        offsets[0], at, base = 0, 1, 0
        for p in parts:
            np.add(p.offsets[1:], base, out=offsets[at:at + p.count])
            at, base = at + p.count, base + p.hashes.size
        return Shingles(hashes, offsets)


def shingle_batch(tokens: TokenBatch, ngram: int) -> Shingles:
    """Word n-gram hashes per text; a text shorter than n words is one shingle, itself."""
    grams, doc = tokens.span_hashes(ngram)
    lengths = tokens.lengths
    counts = np.maximum(lengths - (ngram - 1), 0)
    short = np.flatnonzero((lengths > 0) & (lengths < ngram))
    if short.size:
        counts[short] = 1
        whole = tokens.run_hashes(tokens.offsets[short], lengths[short])
        # each short text's one shingle goes where its (absent) n-grams would be
        at = np.searchsorted(doc, short) + np.arange(short.size)
        merged = np.empty(grams.size + short.size, dtype=grams.dtype)
        is_short = np.zeros(merged.size, dtype=bool)
        is_short[at] = True
        merged[at], merged[~is_short] = whole, grams
        grams = merged
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return Shingles((grams >> _U64(32)).astype(np.uint32), offsets)


@functools.lru_cache(maxsize=8)
def _permutations(cfg: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    def draw(label: str, i: int) -> int:
        digest = hashlib.blake2b(f"{cfg.seed}:{label}:{i}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    a = np.array([(draw("a", i) | 1) & 0xFFFFFFFF for i in range(cfg.num_perm)], dtype=np.uint32)
    b = np.array([draw("b", i) & 0xFFFFFFFF for i in range(cfg.num_perm)], dtype=np.uint32)
    return a, b


def signatures(shingles: Shingles, cfg: MinHashConfig) -> np.ndarray:
    """(n_texts, num_perm) uint32 MinHash signatures; a text without shingles gets all 2^32-1.

    Two different shingles collide under a permutation with probability ~2^-32, which
    biases the Jaccard estimate by far less than its sampling error.
    """
    return np.ascontiguousarray(signature_rows(shingles, cfg).T)


def signature_rows(shingles: Shingles, cfg: MinHashConfig) -> np.ndarray:
    """The signatures transposed, (num_perm, n_texts): the layout they are computed in.

    Each step's min-reduceat writes straight into contiguous rows, and band keys are
    built from whole rows, so clustering never pays for a transpose. (Texts padded to
    one length, min over a (perm, slot, text) block: tried, at most 10% faster here.)
    """
    a, b = _permutations(cfg)
    out = np.empty((cfg.num_perm, shingles.count), dtype=np.uint32)
    present = np.flatnonzero(np.diff(shingles.offsets) > 0)
    if present.size < shingles.count:  # the steps below write every other column
        empty = np.ones(shingles.count, dtype=bool)
        empty[present] = False
        out[:, empty] = np.iinfo(np.uint32).max
    a, b = a[:, None], b[:, None]
    buf = np.empty((cfg.num_perm, _STEP_SHINGLES), dtype=np.uint32)
    ends = shingles.offsets[present + 1]
    first = 0
    while first < present.size:
        # whole texts, until the step holds about _STEP_SHINGLES shingles
        start = shingles.offsets[present[first]]
        last = max(int(np.searchsorted(ends, start + _STEP_SHINGLES, side="right")), first + 1)
        docs = present[first:last]
        x = shingles.hashes[start:ends[last - 1]]
        if x.size > buf.shape[1]:
            buf = np.empty((cfg.num_perm, x.size), np.uint32)
        v = buf[:, : x.size]
        np.multiply(a, x[None, :], out=v)  # wraps mod 2^32, as intended
        np.add(v, b, out=v)
        cuts = shingles.offsets[docs] - start
        if docs[-1] - docs[0] + 1 == docs.size:  # no empty text inside: write in place
            np.minimum.reduceat(v, cuts, axis=1, out=out[:, docs[0]:docs[-1] + 1])
        else:
            out[:, docs] = np.minimum.reduceat(v, cuts, axis=1)
        first = last
    return out


def band_keys(sigs: np.ndarray, cfg: MinHashConfig) -> np.ndarray:
    """(n_texts, bands) uint64: one key per band; equal keys = equal band rows."""
    return band_keys_of_rows(sigs.T, cfg)


def band_keys_of_rows(rows: np.ndarray, cfg: MinHashConfig) -> np.ndarray:
    """band_keys of (num_perm, n_texts) signature rows. The result is a transposed view
    of a (bands, n_texts) array, so each band's keys lie contiguous for bucketing."""
    bands, width = cfg.banding
    view = rows[: bands * width].reshape(bands, width, rows.shape[1])
    key = view[:, 0, :].astype(_U64)
    with np.errstate(over="ignore"):
        for j in range(1, width):
            key *= _U64(_BAND_MIX)
            key += view[:, j, :]
    return mix64(key).T


def candidate_pairs(keys: np.ndarray, cfg: MinHashConfig) -> np.ndarray:
    """Unique (i, j), i < j, pairs of texts in one batch that share any band."""
    return lsh.candidate_pairs(keys, cfg.max_group_pairs)


# callers probe a batch against existing tasks or eval items through this module too
probe_pairs = lsh.probe_pairs


def _gathered(shingles: Shingles, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The shingles of docs[0], docs[1], ... back to back, and each doc's count."""
    starts = shingles.offsets[docs]
    lengths = shingles.offsets[docs + 1] - starts
    skip = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return shingles.hashes[skip + np.arange(int(lengths.sum()))], lengths


def _set_sizes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(|A|, |B|, |A & B|) per row of sorted (shingle << 1 | side) values, padded with
    all-ones: after a repeat is dropped, a shared shingle is a side-0 value followed by
    its side-1 twin."""
    valid = rows != np.iinfo(np.uint64).max
    fresh = valid.copy()
    fresh[:, 1:] &= rows[:, 1:] != rows[:, :-1]
    side = (rows & _U64(1)).astype(bool)
    shared = fresh[:, 1:] & side[:, 1:] & ((rows[:, 1:] >> _U64(1)) == (rows[:, :-1] >> _U64(1)))
    return ((fresh & ~side).sum(axis=1), (fresh & side).sum(axis=1), shared.sum(axis=1))


def exact_jaccard(left: Shingles, right: Shingles, pairs: np.ndarray) -> np.ndarray:
    """Jaccard of the shingle sets of left[pairs[:,0]] and right[pairs[:,1]] (0 if both empty).

    Sets hold the top 32 bits of each shingle hash: two different shingles of one pair
    collide with probability ~ 1e-6 even for 100-word prompts. Each pair's two lists
    become one row (side bit appended), rows of similar length are padded to a power of
    two and sorted row by row: many short sorts instead of one sort of everything.
    """
    n = pairs.shape[0]
    out = np.zeros(n)
    if n == 0:
        return out
    a_values, a_len = _gathered(left, pairs[:, 0])
    b_values, b_len = _gathered(right, pairs[:, 1])
    a_pair, b_pair = np.repeat(np.arange(n), a_len), np.repeat(np.arange(n), b_len)
    # column of each value inside its pair's row: A's values first, then B's
    a_col = np.arange(a_values.size) - np.repeat(np.cumsum(a_len) - a_len, a_len)
    b_col = np.arange(b_values.size) - np.repeat(np.cumsum(b_len) - b_len, b_len) + a_len[b_pair]
    width = 1 << np.ceil(np.log2(np.maximum(a_len + b_len, 1))).astype(np.int64)
    for w in np.unique(width).tolist():
        group = np.flatnonzero(width == w)
        row_of = np.full(n, -1, dtype=np.int64)
        row_of[group] = np.arange(group.size)
        rows = np.full((group.size, w), np.iinfo(np.uint64).max, dtype=_U64)
        in_a, in_b = row_of[a_pair] >= 0, row_of[b_pair] >= 0
        rows[row_of[a_pair[in_a]], a_col[in_a]] = a_values[in_a].astype(_U64) << _U64(1)
        rows[row_of[b_pair[in_b]], b_col[in_b]] = (b_values[in_b].astype(_U64) << _U64(1)) | _U64(1)
        rows.sort(axis=1)
        size_a, size_b, inter = _set_sizes(rows)
        union = size_a + size_b - inter
        out[group] = np.divide(inter, union, out=np.zeros(group.size), where=union > 0)
    return out


def best_partners(n: int, pairs: np.ndarray, sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each text, its most similar verified partner (ties: smallest index) and the Jaccard."""
    partner = np.full(n, -1, dtype=np.int64)
    similarity = np.zeros(n)
    if pairs.size == 0:
        return partner, similarity
    ends = np.concatenate([pairs[:, 0], pairs[:, 1]])
    others = np.concatenate([pairs[:, 1], pairs[:, 0]])
    both = np.concatenate([sims, sims])
    order = np.lexsort((others, -both, ends))  # by text, then Jaccard desc, then partner
    first = np.ones(order.size, dtype=bool)
    first[1:] = ends[order][1:] != ends[order][:-1]
    chosen = order[first]
    partner[ends[chosen]] = others[chosen]
    similarity[ends[chosen]] = both[chosen]
    return partner, similarity


@dataclass(frozen=True)
class Sketches:
    """Everything near-duplicate search needs about a batch of texts, row for row."""

    shingles: Shingles
    signatures: np.ndarray  # (n, num_perm) uint32
    keys: np.ndarray  # (n, bands) uint64


def sketch_texts(texts: list[str], cfg: MinHashConfig, chunk: int = 2048) -> Sketches:
    """Tokenise, shingle, sign and band texts, `chunk` texts at a time.

    Chunks keep every intermediate array small: on this kind of machine touching a
    fresh 100 MB array costs more than the arithmetic done on it.
    """
    bands = cfg.banding[0]
    sigs = np.empty((len(texts), cfg.num_perm), dtype=np.uint32)
    keys = np.empty((bands, len(texts)), dtype=_U64)
    parts = []
    for start in range(0, len(texts), chunk):
        part = shingle_batch(tokenize_batch(texts[start:start + chunk]), cfg.ngram)
        rows = signature_rows(part, cfg)
        keys[:, start:start + part.count] = band_keys_of_rows(rows, cfg).T
        sigs[start:start + part.count] = rows.T
        parts.append(part)
    shingles = Shingles.concat(parts) if parts else Shingles(np.empty(0, np.uint32), np.zeros(1, np.int64))
    return Sketches(shingles, sigs, keys.T)
