"""`exact`: normalised string match against `spec["answer"]`.

Normalisation forgives what a reader would not call a different answer: Unicode
compatibility forms (NFKC: full-width digits, ligatures), case (casefold), runs of
whitespace, surrounding whitespace and trailing sentence punctuation. It deliberately
does not strip inner punctuation, articles or units: "3.5" and "35" stay different.
`spec["answer"]` may be a string or a list of accepted strings.
"""
from __future__ import annotations

import re
import unicodedata

from verifiers.verdict import Verdict, failed

_WHITESPACE = re.compile(r"\s+")
_TRAILING_PUNCTUATION = ".,;:!?"


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _WHITESPACE.sub(" ", text).strip()
    return text.rstrip(_TRAILING_PUNCTUATION).rstrip()


def accepted_answers(spec: dict) -> list[str]:
    answer = spec.get("answer")
    answers = answer if isinstance(answer, list) else [answer]
    if not answers or not all(isinstance(a, str) for a in answers):
        raise ValueError('exact spec needs "answer": a string or a list of strings')
    return answers


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
    answer = spec.get("answer")
    if isinstance(answer, list):
        answer = answer[0] if answer else None
    return answer if isinstance(answer, str) else None
