"""The guard that keeps clean demo logs apart from each other and from evaluation items.

A clean log must not be the same problem as an evaluation item (same task `key`),
repeat an item's words (a shared word 13-gram, or an item shorter than 13 words
appearing whole), repeat another clean prompt word for word, or be a near duplicate of
an earlier clean prompt or item. Otherwise dedup and decontamination would rightly flag
it and the manifest would count a correct decision as a false positive.

Near duplicates are screened with MinHash-LSH over word 3-grams, 8 bands of 6 rows: an
earlier prompt at Jaccard 0.8 collides with probability 0.91, at 0.85 with 0.98, at 0.5
with 0.12. A colliding candidate is dropped and another drawn, so a false collision only
costs a redraw. Prompts under 10 words skip it: below that a 0.8 Jaccard needs the same
words, which the exact check rejects. Band keys go into a Bloom filter sized for the run
(a false positive is one more redraw), so memory stays flat at a million logs.

Everything that depends only on a candidate (its digest, n-gram hashes, LSH band keys,
overlap with the fixed evaluation items) is a pure function, `fingerprint`, computed for
a batch at once with numpy, so worker processes can do it; only the lookups against
earlier admissions happen in `Guard`. Words are hashed with crc32, stable across processes.
"""
import hashlib
import itertools
import zlib
from dataclasses import dataclass

import numpy as np

NGRAM = 13
BANDS, ROWS = 8, 6
LSH_MIN_WORDS = 10
_PERM = np.random.default_rng(20261202).integers(1, 2**63, size=(2, BANDS * ROWS), dtype=np.uint64) | np.uint64(1)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_LOW32 = np.uint64(0xFFFFFFFF)


class _WordHashes(dict):
    """crc32 of each word, memoised: demo prompts reuse a small vocabulary."""

    def __missing__(self, word: str) -> int:
        value = self[word] = zlib.crc32(word.encode())
        return value


_WORD_HASHES = _WordHashes()


def _ngram_tables(token_lists: list[list[str]], lengths: set[int]):
    """For each n in `lengths`: (hash of the n-gram at each position, whether it fits in its doc)."""
    sizes = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
    every_word = itertools.chain.from_iterable(token_lists)
    flat = np.fromiter(map(_WORD_HASHES.__getitem__, every_word), dtype=np.uint64, count=int(sizes.sum()))
    ends = np.repeat(np.cumsum(sizes), sizes)
    position = np.arange(len(flat))
    rolling, tables = flat.copy(), {}
    with np.errstate(over="ignore"):  # wrap-around arithmetic is the hash
        for n in range(1, max(lengths) + 1):
            inside = len(flat) - n + 1
            if n > 1 and inside > 0:
                rolling[:inside] = rolling[:inside] * _MIX + flat[n - 1:]
            if n in lengths:
                tables[n] = (rolling.copy(), position + n <= ends)
    return tables, np.repeat(np.arange(len(token_lists)), sizes)


def _tag(hashes: np.ndarray, n: int) -> np.ndarray:
    """Mix the n-gram length into its hash so a 5-gram never matches a 13-gram."""
    with np.errstate(over="ignore"):
        return hashes * _MIX + np.uint64(n)


def _contains(sorted_keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Which `queries` occur in the sorted array `sorted_keys`."""
    if not len(sorted_keys):
        return np.zeros(len(queries), dtype=bool)
    at = np.searchsorted(sorted_keys, queries).clip(max=len(sorted_keys) - 1)
    return sorted_keys[at] == queries


def _band_keys(shingle_hashes: np.ndarray, doc_of: np.ndarray, docs: int) -> np.ndarray:
    """(docs, BANDS) LSH band keys; rows of docs without shingles stay 0 (and are never used)."""
    keys = np.zeros((docs, BANDS), dtype=np.uint64)
    if not len(shingle_hashes):
        return keys
    x = (shingle_hashes >> np.uint64(32)) ^ (shingle_hashes & _LOW32)
    starts = np.flatnonzero(np.r_[True, doc_of[1:] != doc_of[:-1]])
    with np.errstate(over="ignore"):  # multiply-shift hashing: top 32 bits of a*x + b mod 2**64, a odd
        table = (_PERM[0][:, None] * x[None, :] + _PERM[1][:, None]) >> np.uint64(32)
        signatures = np.minimum.reduceat(table, starts, axis=1).T.reshape(len(starts), BANDS, ROWS)
        rows = np.zeros((len(starts), BANDS), dtype=np.uint64)
        for r in range(ROWS):
            rows = rows * _MIX + signatures[:, :, r]
        keys[doc_of[starts]] = rows * _MIX + np.arange(BANDS, dtype=np.uint64)
    return keys


@dataclass(frozen=True)
class EvalIndex:
    """What clean prompts must not contain: evaluation items' word n-grams (hashes tagged with n)."""

    hashes: np.ndarray  # sorted: every 13-gram of long items, the whole of items under 13 words
    short_starts: np.ndarray  # sorted: first-bigram hashes of items under 13 words
    lengths: frozenset  # n-gram lengths to look for


@dataclass(frozen=True)
class Fingerprints:
    """Per candidate of a batch: digest of its words, LSH band keys, whether it repeats an eval item."""

    digests: list[bytes]
    bands: list[list[int]]  # empty for prompts under LSH_MIN_WORDS words
    touches_eval: list[bool]
    words: list[int]


def build_eval_index(token_lists: list[list[str]]) -> EvalIndex:
    short = {len(t) for t in token_lists if 2 <= len(t) < NGRAM}
    tables, _ = _ngram_tables(token_lists, short | {2, NGRAM})
    hashes, fits = tables[NGRAM]
    found, starts, start = [_tag(hashes[fits], NGRAM)], [], 0
    for tokens in token_lists:  # an item too short for a 13-gram is looked for whole
        if 2 <= len(tokens) < NGRAM:
            found.append(_tag(tables[len(tokens)][0][start:start + 1], len(tokens)))
            starts.append(_tag(tables[2][0][start:start + 1], 2))
        start += len(tokens)
    empty = np.zeros(0, dtype=np.uint64)
    return EvalIndex(np.unique(np.concatenate(found)), np.unique(np.concatenate(starts or [empty])),
                     frozenset(short | {NGRAM}))


def fingerprint(token_lists: list[list[str]], index: EvalIndex | None) -> Fingerprints:
    tables, doc_of = _ngram_tables(token_lists, set(index.lengths if index else ()) | {2, 3, NGRAM})
    long_doc = np.fromiter((len(t) >= LSH_MIN_WORDS for t in token_lists), dtype=bool, count=len(token_lists))
    hashes, fits = tables[3]
    use = fits & long_doc[doc_of]
    keys = _band_keys(hashes[use], doc_of[use], len(token_lists))
    bands = [row if keep else [] for row, keep in zip(keys.tolist(), long_doc.tolist())]
    touches = _touches(index, tables, doc_of, len(token_lists)) if index else np.zeros(len(token_lists), dtype=bool)
    return Fingerprints([digest(t) for t in token_lists], bands, touches.tolist(), [len(t) for t in token_lists])


def _touches(index: EvalIndex, tables: dict, doc_of: np.ndarray, docs: int) -> np.ndarray:
    touches = np.zeros(docs, dtype=bool)
    hashes, fits = tables[NGRAM]
    touches[doc_of[fits][_contains(index.hashes, _tag(hashes[fits], NGRAM))]] = True
    # Short items: only where an item's first two words occur, try each item length.
    bigrams, fits = tables[2]
    where = np.flatnonzero(fits)
    where = where[_contains(index.short_starts, _tag(bigrams[where], 2))]
    for n in index.lengths - {NGRAM}:
        hashes, fits = tables[n]
        at = where[fits[where]]
        touches[doc_of[at][_contains(index.hashes, _tag(hashes[at], n))]] = True
    return touches


class Guard:
    """Remembers what must not be generated again: eval items' keys and words, and every clean prompt."""

    def __init__(self, capacity: int) -> None:
        self.eval_keys: set = set()
        self.index: EvalIndex | None = None
        self.seen: set[bytes] = set()
        self.problems: set[tuple] = set()
        # ~64 bits per band key keeps the filter under 3% full: <0.1% false positives per lookup
        self.bloom_bits = 1 << max(20, (capacity * BANDS * 64 - 1).bit_length())
        self.bloom = np.zeros(self.bloom_bits // 8, dtype=np.uint8)
        self._batch: set[int] = set()

    def add_eval(self, items: list[tuple[tuple, list[str]]]) -> None:
        """Register all evaluation items at once, as (key, words) pairs."""
        token_lists = [tokens for _, tokens in items]
        self.index = build_eval_index(token_lists)
        prints = fingerprint(token_lists, None)
        self._remember(np.array([b for b in prints.bands if b], dtype=np.uint64).reshape(-1, BANDS))
        self.eval_keys.update(key for key, _ in items)
        self.seen.update(prints.digests)

    def screen(self, prints: Fingerprints) -> list[tuple[bytes, list[int], bool]]:
        """(digest, band keys, ruled out) per candidate; ruled out: repeats an eval item's words,
        or a band collides with a prompt admitted before this batch (within it, `admit` checks)."""
        self._flush()
        long_rows = [i for i, b in enumerate(prints.bands) if b]
        collide = set()
        if long_rows:
            keys = np.array([prints.bands[i] for i in long_rows], dtype=np.uint64)
            collide = {long_rows[i] for i in np.flatnonzero(self._in_bloom(keys).any(axis=1)).tolist()}
        return [(d, b, t or i in collide) for i, (d, b, t) in enumerate(zip(prints.digests, prints.bands, prints.touches_eval))]

    def admit(self, key: tuple, token_digest: bytes, bands: list[int], ruled_out: bool) -> bool:
        """True (and remembered) if a clean log with this task would be new and uncontaminated."""
        if ruled_out or key in self.eval_keys or key in self.problems:
            return False
        if token_digest in self.seen or not self._batch.isdisjoint(bands):
            return False
        self.seen.add(token_digest)
        self._batch.update(bands)
        if key[0] == "word":  # a word problem's key is its numbers: same numbers, same problem
            self.problems.add(key)
        return True

    def _positions(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mask = np.uint64(self.bloom_bits - 1)
        return keys & mask, (keys >> np.uint64(32)) & mask

    def _in_bloom(self, keys: np.ndarray) -> np.ndarray:
        found = np.ones(keys.shape, dtype=bool)
        for p in self._positions(keys):
            found &= (self.bloom[p >> np.uint64(3)] >> (p & np.uint64(7)).astype(np.uint8)) & 1 == 1
        return found

    def _remember(self, keys: np.ndarray) -> None:
        for p in self._positions(keys.ravel()):
            np.bitwise_or.at(self.bloom, p >> np.uint64(3), (1 << (p & np.uint64(7))).astype(np.uint8))

    def _flush(self) -> None:
        """Move the band keys admitted during the last batch into the Bloom filter."""
        if self._batch:
            self._remember(np.fromiter(self._batch, dtype=np.uint64, count=len(self._batch)))
            self._batch.clear()


def digest(tokens: list[str]) -> bytes:
    return hashlib.blake2b(" ".join(tokens).encode(), digest_size=8).digest()
