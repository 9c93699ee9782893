"""Normalised forms of prompt text, stable content hashes, and bulk tokenisation.

Two forms, for two jobs:
- `normalize_text` (Unicode NFKC, case-folded, whitespace collapsed) is what exact
  dedup and content ids hash: two logs that differ only in case, spacing or full-width
  characters are the same task.
- `strong_tokens` / `normalize_strong` additionally drop punctuation, so decontamination
  and near-duplicate detection survive "What is 17*23?" becoming "what is 17 * 23".
  Arithmetic operators (`+ * / = < > ^ %`) are kept as one-character tokens because
  they are content, not formatting: "17+23" and "17*23" are different problems and
  must not normalise to the same text. Every other non-alphanumeric character
  (ASCII punctuation, `_`, `-`, Unicode punctuation and symbols) becomes a separator.

`tokenize_batch` produces the same tokens as `strong_tokens`, but for a whole batch of
texts at once and as stable 64-bit hashes: the Unicode work runs once on the joined
batch (C loops inside CPython), then numpy finds token boundaries and hashes them with
a polynomial rolling hash. Nothing here uses `hash()`, whose value changes between
processes, so ids and hashes are the same in every run, on every machine.
"""
from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from dataclasses import dataclass

import numpy as np

OPERATORS = "+*/=<>^%"
_STRONG_TOKEN = re.compile(r"[^\W_]+|[" + re.escape(OPERATORS) + "]")
# Non-ASCII characters that are not word characters (Unicode punctuation, symbols,
# spaces); ASCII is classified by the byte table below, so this only runs on the rest.
_NON_ASCII_NON_WORD = re.compile(r"(?![\x00-\x7f])\W")
_SEP = "\x00"  # joins a batch; NFKC and casefold never create or consume it
_U64 = np.uint64
_MASK64 = (1 << 64) - 1
# Odd multipliers (invertible mod 2^64) for the byte and token polynomial hashes.
_BYTE_BASE = 0x9E3779B97F4A7C15
_TOKEN_BASE = 0xC2B2AE3D27D4EB4F
_LENGTH_MIX = 0x165667B19E3779F9


def normalize_text(text: str) -> str:
    """NFKC, case-folded, whitespace runs collapsed to one space, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def strong_tokens(text: str) -> list[str]:
    """The words and operators of `normalize_text(text)`, punctuation dropped."""
    return _STRONG_TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())


def normalize_strong(text: str) -> str:
    """`strong_tokens` joined by single spaces: the decontamination/near-dup form."""
    return " ".join(strong_tokens(text))


def content_hash(text: str) -> str:
    """sha256 hex of the normalised text: the content id of a prompt."""
    return hashlib.sha256(normalize_text(text).encode("utf-8")).hexdigest()


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised: spreads every input bit over all output bits."""
    z = values.astype(_U64, copy=True)
    z ^= z >> _U64(30)
    z *= _U64(0xBF58476D1CE4E5B9)
    z ^= z >> _U64(27)
    z *= _U64(0x94D049BB133111EB)
    z ^= z >> _U64(31)
    return z


@functools.lru_cache(maxsize=8)
def _powers(base: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """base^i and base^-i mod 2^64 for i < size (size is a power of two, so few sizes)."""
    inverse = pow(base, -1, 1 << 64)
    up = np.full(size, base, dtype=_U64)
    up[0] = 1
    down = np.full(size, inverse, dtype=_U64)
    down[0] = 1
    with np.errstate(over="ignore"):
        return np.multiply.accumulate(up), np.multiply.accumulate(down)


def _power_tables(base: int, needed: int) -> tuple[np.ndarray, np.ndarray]:
    return _powers(base, 1 << max(10, int(needed).bit_length()))


# Runs up to this many tokens are hashed by Horner's rule over shifted token arrays
# (one multiply-add per token position) instead of through a prefix sum over the batch.
_HORNER_MAX = 16


@dataclass(frozen=True)
class TokenBatch:
    """Strong tokens of a batch of texts as stable 64-bit hashes.

    hashes[offsets[d]:offsets[d+1]] are the tokens of text d, in order. A run of
    tokens t_0..t_{m-1} hashes to mix64(sum t_j B^j + m * L) (mod 2^64), whichever
    method computes it, so the same words hash the same in any text and any process.
    """

    hashes: np.ndarray  # uint64, one per token
    offsets: np.ndarray  # int64, len(texts) + 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @functools.cached_property
    def _doc_of_token(self) -> np.ndarray:
        return np.repeat(np.arange(self.lengths.size), self.lengths)

    @functools.cached_property
    def _prefix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # positions count from each text's first token, so the power tables stay as
        # short as the longest text, not as long as the batch
        relative = np.arange(self.hashes.size) - self.offsets[:-1][self._doc_of_token]
        prefix, down = _positional_prefix(self.hashes, relative, _TOKEN_BASE)
        return prefix, down, relative

    def span_hashes(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Hashes of every run of m consecutive tokens inside one text, and its text index."""
        hashes, doc, _ = self.spans(m)
        return hashes, doc

    def spans(self, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """span_hashes plus each run's first token (an index into `hashes`)."""
        n_tokens = self.hashes.size
        if m <= 0 or n_tokens < m:
            return np.empty(0, _U64), np.empty(0, np.int64), np.empty(0, np.int64)
        count = n_tokens - m + 1
        doc_of_token = self._doc_of_token
        starts = np.flatnonzero(doc_of_token[:count] == doc_of_token[m - 1:])
        if m > _HORNER_MAX:
            return self._runs(starts, np.full(starts.size, m)), doc_of_token[starts], starts
        # Horner over contiguous shifted slices: every start at once, no gathers
        tokens = self.hashes
        poly = tokens[m - 1:m - 1 + count].copy()
        with np.errstate(over="ignore"):
            for j in range(m - 2, -1, -1):
                poly *= _U64(_TOKEN_BASE)
                poly += tokens[j:j + count]
            poly = poly[starts]
            poly += _U64(m * _LENGTH_MIX & _MASK64)
        return mix64(poly), doc_of_token[starts], starts

    def whole_hashes(self) -> np.ndarray:
        """One hash per text over all its tokens; equal to span_hashes(len) of that text."""
        return self.run_hashes(self.offsets[:-1], self.lengths)

    def run_hashes(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Hash of tokens[starts[i] : starts[i] + lengths[i]]; each run must lie inside one text."""
        if lengths.size and int(lengths.max()) <= _HORNER_MAX:
            return self._short_runs(starts, lengths)
        return self._runs(starts, lengths)

    def _short_runs(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        tokens = self.hashes
        poly = np.zeros(starts.size, dtype=_U64)
        last = max(tokens.size - 1, 0)
        with np.errstate(over="ignore"):
            for j in range(int(lengths.max()) - 1, -1, -1):
                poly *= _U64(_TOKEN_BASE)
                inside = j < lengths
                if tokens.size:
                    poly[inside] += tokens[np.minimum(starts[inside] + j, last)]
            poly += lengths.astype(_U64) * _U64(_LENGTH_MIX)
        return mix64(poly)

    def _runs(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        prefix, down, relative = self._prefix
        if self.hashes.size:
            scale = down[relative[np.minimum(starts, self.hashes.size - 1)]]
        else:
            scale = np.ones(starts.size, _U64)
        with np.errstate(over="ignore"):
            poly = (prefix[starts + lengths] - prefix[starts]) * scale
            poly += lengths.astype(_U64) * _U64(_LENGTH_MIX)
        return mix64(poly)


def _positional_prefix(values: np.ndarray, relative: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """prefix[i] = sum_{j<i} values[j] * base^relative[j] (mod 2^64), and base^-k.

    A run that shares one reference point hashes to (prefix[end] - prefix[start]) *
    base^-relative[start]: the same value wherever the run sits.
    """
    size = int(relative.max()) + 1 if relative.size else 1
    up, down = _power_tables(base, size)
    prefix = np.zeros(values.size + 1, dtype=_U64)
    with np.errstate(over="ignore"):
        np.cumsum(values.astype(_U64) * up[relative], out=prefix[1:])
    return prefix, down


def _byte_classes() -> bytes:
    """0 = separator, 1 = word byte, 2 = operator, as a `bytes.translate` table; bytes
    >= 0x80 are parts of words (non-word non-ASCII characters were already replaced by
    spaces)."""
    table = bytearray(256)
    for code in range(256):
        char = chr(code)
        if code >= 0x80 or (char.isascii() and char.isalnum()):
            table[code] = 1
        elif char in OPERATORS:
            table[code] = 2
    return bytes(table)


_CLASSES = _byte_classes()


def _fold(text: str) -> str:
    if text.isascii():  # NFKC is the identity on ASCII and casefold is lower()
        return text.lower()
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _NON_ASCII_NON_WORD.sub(" ", folded)


def _joined_form(texts: list[str]) -> tuple[str, bool]:
    """The folded texts joined by _SEP, and whether folding kept every text's length
    (all ASCII: then byte offsets of texts follow from their lengths)."""
    joined = _SEP.join(texts)
    if joined.count(_SEP) != max(len(texts) - 1, 0):
        texts = [text.replace(_SEP, " ") for text in texts]
        joined = _SEP.join(texts)
    if joined.isascii():  # one C call folds the whole batch
        return joined.lower(), True
    return _SEP.join(_fold(text) for text in texts), False


# Bytes hashed per prefix-sum window: the window's uint64 arrays (512 KiB) stay in L2
# (measured: ~1.4x faster than 256 KiB windows) and its power tables stay small; a
# token never straddles two windows.
_BYTE_WINDOW = 1 << 16


def _token_bounds(encoded: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) byte offsets of every token: runs of word bytes, and single operators."""
    classes = encoded.translate(_CLASSES)  # C loop, no index array
    cls = np.frombuffer(classes, dtype=np.uint8)
    word = cls == 1
    edges = np.flatnonzero(word[1:] != word[:-1]) + 1
    if word[0]:
        edges = np.concatenate([[0], edges])
    if word[-1]:
        edges = np.append(edges, word.size)
    starts, ends = edges[0::2], edges[1::2]  # word runs open and close alternately
    if b"\x02" not in classes:  # no operator at all: skip a pass over every byte
        return starts, ends
    ops = np.flatnonzero(cls == 2)
    # merge operator tokens in by position (they never overlap a word run)
    at = np.searchsorted(starts, ops) + np.arange(ops.size)
    is_op = np.zeros(starts.size + ops.size, dtype=bool)
    is_op[at] = True
    merged_starts = np.empty(is_op.size, dtype=np.int64)
    merged_ends = np.empty(is_op.size, dtype=np.int64)
    merged_starts[at], merged_ends[at] = ops, ops + 1
    merged_starts[~is_op], merged_ends[~is_op] = starts, ends
    return merged_starts, merged_ends


def _byte_run_polys(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """sum_j data[s + j] * B^j (mod 2^64) for every run [s, e), window by window.

    Within a window, positions count from its first byte: (prefix[e] - prefix[s]) *
    B^-s is the same value wherever the run sits, so windows change nothing but speed.
    """
    poly = np.empty(starts.size, dtype=_U64)
    first = 0
    while first < starts.size:
        low = int(starts[first])
        last = max(int(np.searchsorted(starts, low + _BYTE_WINDOW)), first + 1)
        high = int(ends[last - 1])
        up, down = _power_tables(_BYTE_BASE, high - low)
        prefix = np.zeros(high - low + 1, dtype=_U64)
        local_starts, local_ends = starts[first:last] - low, ends[first:last] - low
        with np.errstate(over="ignore"):
            scaled = data[low:high].astype(_U64)
            scaled *= up[: high - low]
            np.cumsum(scaled, out=prefix[1:])
            poly[first:last] = (prefix[local_ends] - prefix[local_starts]) * down[local_starts]
        first = last
    return poly


def tokenize_batch(texts: list[str]) -> TokenBatch:
    """Strong tokens of every text, hashed; the same tokens `strong_tokens` returns."""
    joined, same_lengths = _joined_form(texts)
    encoded = joined.encode("utf-8")
    if not encoded:
        return TokenBatch(np.empty(0, _U64), np.zeros(len(texts) + 1, np.int64))
    data = np.frombuffer(encoded, dtype=np.uint8)
    starts, ends = _token_bounds(encoded)
    poly = _byte_run_polys(data, starts, ends)
    with np.errstate(over="ignore"):
        poly += (ends - starts).astype(_U64) * _U64(_LENGTH_MIX)
    if same_lengths:  # one byte per character: texts start where their lengths say
        text_starts = np.zeros(len(texts), dtype=np.int64)
        np.cumsum([len(text) + 1 for text in texts[:-1]], out=text_starts[1:])
    else:
        text_starts = np.concatenate([[0], np.flatnonzero(data == 0) + 1])
    offsets = np.append(np.searchsorted(starts, text_starts), starts.size).astype(np.int64)
    return TokenBatch(mix64(poly), offsets)
