"""`exact`: normalised string match against `spec["answer"]`.

Normalisation forgives what a reader would not call a different answer: Unicode
compatibility forms (NFKC: full-width digits, ligatures), case (casefold), runs of
whitespace, surrounding whitespace and trailing sentence punctuation. It deliberately
does not strip inner punctuation, articles or units: "3.5" and "35" stay different.
`spec["answer"]` may be a string, a number (compared as JSON writes it), or a non-empty
list of accepted strings and numbers.
"""
from __future__ import annotations

import re
import unicodedata

from verifiers.math import answer_text
from verifiers.verdict import Verdict, failed

_WHITESPACE = re.compile(r"\s+")
_TRAILING_PUNCTUATION = ".,;:!?"


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _WHITESPACE.sub(" ", text).strip()
    return text.rstrip(_TRAILING_PUNCTUATION).rstrip()


def accepted_answers(spec: dict) -> list[str]:
    answer = spec.get("answer")
    answers = [answer_text(a) for a in (answer if isinstance(answer, list) else [answer])]
    if not answers or any(a is None for a in answers):
        raise ValueError('exact spec needs "answer": a string or number, or a list of them')
    return answers


def reference_problem(reference: dict) -> str | None:
    """The reference shape this verifier scores (see verifiers.registry.Verifier)."""
    try:
        accepted_answers(reference)
    except ValueError:
        return f"needs `answer` (a string or number, or a non-empty list of them); has {sorted(reference)}"
    return None


def verify(spec: dict, completion: str) -> Verdict:
    try:
        answers = accepted_answers(spec)
    except ValueError as error:
        return failed("format_error", f"invalid spec: {error}", correctness=0.0)
    got = normalise(completion)
    if not got:
        return failed("format_error", "empty completion", correctness=0.0)
    if got in {normalise(a) for a in answers}:
        return Verdict(reward=1.0, passed=True, status="ok", components={"correctness": 1.0})
    return failed("wrong", f"expected {answers[0]!r}", correctness=0.0)


def gold_completion(spec: dict) -> str | None:
    try:
        return accepted_answers(spec)[0]
    except ValueError:
        return None
