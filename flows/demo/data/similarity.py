"""The text similarity the demo data is built to respect.

Curation (issue 4) finds duplicates on a normalised form and near duplicates by Jaccard
similarity of word shingles. The demo generator uses the same yardstick to keep clean
logs apart from each other and from evaluation items, and to make each planted near
duplicate similar enough (word 3-gram Jaccard >= 0.85) to be findable at 0.8.
Normalisation: Unicode NFKC, case-folded, words are runs of letters/digits/underscore,
so case, spacing, punctuation and full-width digits do not matter.
"""
import re
import unicodedata

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def shingles(tokens: list[str], n: int = 3) -> set[str]:
    """Word n-grams; a text shorter than n is one shingle, so it still compares."""
    if len(tokens) < n:
        return {" ".join(tokens)}
    return {" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def word_jaccard(a: str, b: str, n: int = 3) -> float:
    return jaccard(shingles(words(a), n), shingles(words(b), n))


def prompt_text(messages: list[dict]) -> str:
    """The text curation compares: every message up to the failed answer, in order."""
    return "\n".join(m["content"] for m in messages)
