"""Decontamination: find prompts that are (reformatted) copies of evaluation items.

Three tests, strongest evidence first, all on the strong normal form
(`tasks.curate.similarity.normalize`: NFKC, case-folded, punctuation dropped, full-width digits folded):
1. exact: the whole prompt equals an item.
2. overlap: the prompt contains enough of the item's *units*. An item is split into
   sentences; a sentence of at least n words (default 13) contributes its word
   n-grams, a shorter one contributes itself whole. A unit matches wherever its words
   appear contiguously in the prompt, ignoring the prompt's own punctuation, so an
   added or moved preamble sentence, or a dropped full stop, changes nothing. The item
   is matched when the matched units cover at least `min_coverage` of its words
   (units weighted by length). Units that occur in `boilerplate_items` or more
   items ("Answer with a number.") say nothing about which item leaked and are not
   indexed, so a clean prompt that shares a template sentence or common words with
   an item is kept.
3. near duplicate: MinHash-LSH against the items, verified by exact Jaccard on word
   shingles >= the MinHash threshold; catches typos that break every unit.

Probing is vectorised: the prompt's m-grams, for each unit length m present in the
index, are hashed with the same stable 64-bit hash as the units and tested against a
bitmap before an exact sorted-array lookup. This module does not read or write the
lake; `tasks.curate.curation` feeds it prompts and records its evidence.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

import numpy as np

from tasks.curate.similarity import minhash
from tasks.curate.similarity.normalize import TokenBatch, strong_tokens, tokenize_batch

_SENTENCE_END = re.compile(r"(?<=[.!?;:。])\s+|\n+")
_BITMAP_BITS = 24
# Units longer than this are found through their first _ANCHOR words, so a prompt is
# probed once for all of them instead of once per unit length.
_ANCHOR = 4
_U64 = np.uint64


@dataclass(frozen=True)
class DecontamConfig:
    """ngram: words per overlap unit for long sentences (shorter sentences are units whole).
    min_coverage: fraction of an item's (non-boilerplate) words its matched units must cover.
    boilerplate_items: a unit found in this many items or more is not evidence.
    minhash: near-duplicate settings; its threshold is the Jaccard that counts as a copy.
    chunk: prompts per vectorised step (memory stays bounded by it).
    """

    ngram: int = 13
    min_coverage: float = 0.5
    boilerplate_items: int = 2
    minhash: minhash.MinHashConfig = field(default_factory=minhash.MinHashConfig)
    chunk: int = 4096

    def __post_init__(self) -> None:
        if self.ngram < 2:
            raise ValueError(f"ngram must be >= 2 words, got {self.ngram}")
        if not 0.0 < self.min_coverage <= 1.0:
            raise ValueError(f"min_coverage must be in (0, 1], got {self.min_coverage}")
        if self.boilerplate_items < 2:
            raise ValueError("boilerplate_items must be >= 2 (1 would drop every unit)")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")


@dataclass(frozen=True)
class EvalItem:
    eval_set: str
    item_id: str
    prompt: str


@dataclass(frozen=True)
class Contamination:
    """Prompt `record` copies eval item `item` (an index into the index's items)."""

    record: int
    item: int
    method: str  # exact | overlap | near_duplicate
    evidence: dict


@dataclass(frozen=True)
class EvalIndex:
    items: tuple[EvalItem, ...]
    sentences: tuple[tuple[str, ...], ...]  # strong tokens of every item sentence
    whole: np.ndarray  # sorted whole-item hashes
    whole_item: np.ndarray
    units: np.ndarray  # sorted unit hashes (unique)
    unit_item: np.ndarray
    unit_sentence: np.ndarray
    unit_start: np.ndarray
    unit_length: np.ndarray
    unit_lengths: tuple[int, ...]  # distinct probe lengths: short units', and the anchor's
    anchors: np.ndarray  # sorted hashes of the first _ANCHOR words of every longer unit
    anchor_unit: np.ndarray  # the unit each anchor opens
    item_weight: np.ndarray  # words covered by an item's indexed units
    bitmap: np.ndarray  # bit (h >> 40) set for every unit hash and anchor
    sketches: minhash.Sketches
    shingle_bitmap: np.ndarray  # bit (s >> 8) set for every item shingle


def _split_sentences(prompt: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(unicodedata.normalize("NFKC", prompt)) if s.strip()]


def _bitmap(values: np.ndarray, bits: int, shift: int) -> np.ndarray:
    bitmap = np.zeros(1 << (bits - 3), dtype=np.uint8)
    slots = (values >> values.dtype.type(shift)).astype(np.int64)
    np.bitwise_or.at(bitmap, slots >> 3, (1 << (slots & 7)).astype(np.uint8))
    return bitmap


def _in_bitmap(bitmap: np.ndarray, values: np.ndarray, shift: int) -> np.ndarray:
    slots = (values >> values.dtype.type(shift)).astype(np.int64)
    return (bitmap[slots >> 3] >> (slots & 7).astype(np.uint8)) & 1 == 1


def _sentence_units(tokens: TokenBatch, n: int) -> tuple[np.ndarray, ...]:
    """(hash, sentence, start, length) of every unit of every sentence."""
    grams, gram_sentence = tokens.span_hashes(n)
    gram_start = np.arange(gram_sentence.size) - np.searchsorted(gram_sentence, gram_sentence)
    lengths = tokens.lengths
    short = np.flatnonzero((lengths > 0) & (lengths < n))
    return (np.concatenate([grams, tokens.whole_hashes()[short]]),
            np.concatenate([gram_sentence, short]),
            np.concatenate([gram_start, np.zeros(short.size, np.int64)]),
            np.concatenate([np.full(grams.size, n), lengths[short]]))


def build_eval_index(items: list[EvalItem], cfg: DecontamConfig) -> EvalIndex:
    """Index evaluation items once; probe it with any number of prompt batches."""
    prompts = [item.prompt for item in items]
    sentences = [_split_sentences(p) for p in prompts]
    sentence_item = np.repeat(np.arange(len(items)), [len(s) for s in sentences])
    flat = [s for group in sentences for s in group]
    tokens = tokenize_batch(flat)
    unit_hash, unit_sentence, unit_start, unit_length = _sentence_units(tokens, cfg.ngram)
    unit_item = sentence_item[unit_sentence]
    # one row per (item, unit hash); then drop hashes shared by many items (boilerplate)
    _, first = np.unique(np.stack([unit_item.astype(_U64), unit_hash], 1), axis=0, return_index=True)
    keep = np.sort(first)
    hashes, counts = np.unique(unit_hash[keep], return_counts=True)
    common = hashes[counts >= cfg.boilerplate_items]
    keep = keep[~np.isin(unit_hash[keep], common)]
    order = keep[np.argsort(unit_hash[keep], kind="stable")]
    item_weight = np.bincount(unit_item[order], weights=unit_length[order], minlength=len(items))
    whole = tokenize_batch(prompts).whole_hashes()
    whole_order = np.argsort(whole, kind="stable")
    sketches = minhash.sketch_texts(prompts, cfg.minhash)
    long_units = np.flatnonzero(unit_length[order] > _ANCHOR)
    anchors = tokens.run_hashes(tokens.offsets[unit_sentence[order][long_units]] + unit_start[order][long_units],
                                np.full(long_units.size, _ANCHOR))
    anchor_order = np.argsort(anchors, kind="stable")
    lengths = set(unit_length[order][unit_length[order] <= _ANCHOR].tolist()) | ({_ANCHOR} if long_units.size else set())
    return EvalIndex(
        items=tuple(items), sentences=tuple(tuple(strong_tokens(s)) for s in flat),
        whole=whole[whole_order], whole_item=whole_order,
        units=unit_hash[order], unit_item=unit_item[order], unit_sentence=unit_sentence[order],
        unit_start=unit_start[order], unit_length=unit_length[order],
        unit_lengths=tuple(sorted(lengths)), anchors=anchors[anchor_order],
        anchor_unit=long_units[anchor_order], item_weight=item_weight,
        bitmap=_bitmap(np.concatenate([unit_hash[order], anchors]), _BITMAP_BITS, 64 - _BITMAP_BITS),
        sketches=sketches,
        shingle_bitmap=_bitmap(sketches.shingles.hashes, _BITMAP_BITS, 32 - _BITMAP_BITS))


def _lookup(sorted_values: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query index, position in sorted_values) for queries that are present."""
    if sorted_values.size == 0 or queries.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    pos = np.minimum(np.searchsorted(sorted_values, queries), sorted_values.size - 1)
    found = np.flatnonzero(sorted_values[pos] == queries)
    return found, pos[found]


def _exact_matches(tokens: TokenBatch, index: EvalIndex, base: int) -> list[Contamination]:
    whole = tokens.whole_hashes()
    nonempty = np.flatnonzero(tokens.lengths > 0)
    found, pos = _lookup(index.whole, whole[nonempty])
    return [Contamination(base + int(nonempty[f]), int(index.whole_item[p]), "exact", {})
            for f, p in zip(found, pos)]


def _overlap_matches(tokens: TokenBatch, index: EvalIndex, cfg: DecontamConfig,
                     base: int) -> list[Contamination]:
    """Records whose matched units cover >= min_coverage of some item."""
    hit_record, hit_unit = [], []
    for m in index.unit_lengths:
        grams, record, starts = tokens.spans(m)
        maybe = np.flatnonzero(_in_bitmap(index.bitmap, grams, 64 - _BITMAP_BITS))
        found, unit = _lookup(index.units, grams[maybe])
        hit_record.append(record[maybe[found]])
        hit_unit.append(unit)
        if m == _ANCHOR and index.anchors.size:
            record, unit = _anchored_hits(tokens, index, grams[maybe], record[maybe], starts[maybe])
            hit_record.append(record)
            hit_unit.append(unit)
    if not hit_record or sum(h.size for h in hit_record) == 0:
        return []
    pairs = np.unique(np.stack([np.concatenate(hit_record), np.concatenate(hit_unit)], 1), axis=0)
    record, unit = pairs[:, 0], pairs[:, 1]
    n_items = np.int64(len(index.items))
    key = record * n_items + index.unit_item[unit]
    keys, inverse = np.unique(key, return_inverse=True)
    covered = np.bincount(inverse, weights=index.unit_length[unit])
    coverage = covered / np.maximum(index.item_weight[keys % n_items], 1)
    out = []
    best: dict[int, tuple[float, int]] = {}
    for k, c in zip(keys[coverage >= cfg.min_coverage].tolist(), coverage[coverage >= cfg.min_coverage].tolist()):
        r, item = divmod(k, int(n_items))
        if r not in best or c > best[r][0]:
            best[r] = (c, item)
    for r, (c, item) in sorted(best.items()):
        units = unit[(record == r) & (index.unit_item[unit] == item)]
        longest = int(units[np.argmax(index.unit_length[units])])
        out.append(Contamination(base + r, item, "overlap", {
            "coverage": round(c, 4), "units_matched": int(units.size),
            "ngram": _unit_text(index, longest)}))
    return out


def _anchored_hits(tokens: TokenBatch, index: EvalIndex, grams: np.ndarray, record: np.ndarray,
                   starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Long units whose anchor occurs at `starts`, confirmed by hashing the whole unit there."""
    lo = np.searchsorted(index.anchors, grams, side="left")
    counts = np.searchsorted(index.anchors, grams, side="right") - lo
    at = np.repeat(np.arange(grams.size), counts)
    slot = np.repeat(lo, counts) + (np.arange(at.size) - np.repeat(np.cumsum(counts) - counts, counts))
    unit = index.anchor_unit[slot]
    length = index.unit_length[unit]
    fits = starts[at] + length <= tokens.offsets[record[at] + 1]
    at, unit, length = at[fits], unit[fits], length[fits]
    same = tokens.run_hashes(starts[at], length) == index.units[unit]
    return record[at[same]], unit[same]


def _unit_text(index: EvalIndex, unit: int) -> str:
    start = int(index.unit_start[unit])
    words = index.sentences[int(index.unit_sentence[unit])]
    return " ".join(words[start:start + int(index.unit_length[unit])])


def _near_duplicates(tokens: TokenBatch, index: EvalIndex, cfg: DecontamConfig,
                     base: int) -> list[Contamination]:
    """MinHash matches, only for records whose shingles could reach the threshold at all."""
    mh = cfg.minhash
    shingles = minhash.shingle_batch(tokens, mh.ngram)
    present = _in_bitmap(index.shingle_bitmap, shingles.hashes, 32 - _BITMAP_BITS)
    doc = np.repeat(np.arange(shingles.count), np.diff(shingles.offsets))
    shared = np.bincount(doc, weights=present, minlength=shingles.count)
    # J(R, I) >= t needs |R & I| >= t |R|, and R & I lies inside all items' shingles
    hopeful = np.flatnonzero((shared >= mh.threshold * np.diff(shingles.offsets)) & (shared > 0))
    if hopeful.size == 0:
        return []
    sub = _select(shingles, hopeful)
    keys = minhash.band_keys_of_rows(minhash.signature_rows(sub, mh), mh)
    pairs = minhash.probe_pairs(keys, index.sketches.keys)
    sims = minhash.exact_jaccard(sub, index.sketches.shingles, pairs)
    good = sims >= mh.threshold
    partner, similarity = minhash.best_partners(sub.count + index.sketches.shingles.count,
                                                np.stack([pairs[good, 0], sub.count + pairs[good, 1]], 1),
                                                sims[good])
    return [Contamination(base + int(hopeful[r]), int(partner[r]) - sub.count, "near_duplicate",
                          {"similarity": round(float(similarity[r]), 4)})
            for r in np.flatnonzero(partner[: sub.count] >= 0)]


def _select(shingles: minhash.Shingles, docs: np.ndarray) -> minhash.Shingles:
    lengths = shingles.offsets[docs + 1] - shingles.offsets[docs]
    starts = shingles.offsets[docs]
    skip = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    offsets = np.zeros(docs.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return minhash.Shingles(shingles.hashes[skip + np.arange(int(lengths.sum()))], offsets)


def find_contamination(texts: list[str], index: EvalIndex, cfg: DecontamConfig) -> list[Contamination]:
    """One Contamination per contaminated text (strongest evidence), ordered by text."""
    found: dict[int, Contamination] = {}
    for base in range(0, len(texts), cfg.chunk):
        tokens = tokenize_batch(texts[base:base + cfg.chunk])
        for hit in (_exact_matches(tokens, index, base) + _overlap_matches(tokens, index, cfg, base)
                    + _near_duplicates(tokens, index, cfg, base)):
            found.setdefault(hit.record, hit)
    return [_with_item(found[r], index) for r in sorted(found)]


def _with_item(hit: Contamination, index: EvalIndex) -> Contamination:
    item = index.items[hit.item]
    evidence = {"eval_set": item.eval_set, "item_id": item.item_id, "method": hit.method, **hit.evidence}
    return Contamination(hit.record, hit.item, hit.method, evidence)
