"""Each verifier's record says which references it scores (`reference_problem`); ingest's
two fast paths, the native scanner and the feature query, must say the same for every
shape, so a log ingest keeps is one its verifier can score and one it quarantines is
one it cannot (the reason is the record's own words)."""
from __future__ import annotations

import json

import duckdb
import pytest

from tasks.ingest.checks import LogRules, explain
from tasks.ingest.features import feature_sql
from tasks.ingest.lines import read_chunks
from tests.tasks.ingest.test_scan import _assert_same, _rows_both_ways
from tests.tasks.logs import log_with
from verifiers.registry import VERIFIERS

CODE = {"entry_point": "add", "tests": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}
REFERENCES = [
    {"answer": "42"}, {"answer": 42}, {"answer": -2.5}, {"answer": 12345678901234567890}, {"answer": ""},
    {"answer": True}, {"answer": None}, {"answer": ["colour", 3]}, {"answer": []}, {"answer": [["x"]]},
    {"answer": [None]}, {"answer": {"v": 1}}, {}, {"solution": "4"},
    CODE, {**CODE, "solution": "def add(a, b):\n    return a + b\n"}, {**CODE, "solution": None},
    {**CODE, "solution": 3}, {**CODE, "entry_point": "1add"}, {**CODE, "entry_point": "a-b"},
    {**CODE, "tests": "assert add(1, 2) == 3"}, {**CODE, "tests": 5}, {"tests": CODE["tests"]},
    {"schema": {"type": "object"}}, {"schema": {}}, {"schema": "object"}, {"schema": None}, {"schema": []},
    {"schema": {"type": "object"}, "answer": {"a": 1}},
]
CASES = {f"{name}:{json.dumps(ref)}": (name, ref) for name in VERIFIERS for ref in REFERENCES}


def test_the_native_scanner_and_the_feature_query_agree_on_every_shape(tmp_path):
    lines = [log_with(verifier=name, reference=ref) for name, ref in CASES.values()]
    fast, slow, _ = _rows_both_ways(tmp_path, [line.encode() for line in lines])
    _assert_same(fast, slow, list(CASES))


@pytest.mark.parametrize("name", sorted(VERIFIERS))
def test_the_feature_query_asks_what_the_record_says(tmp_path, name):
    refs = [ref for verifier, ref in CASES.values() if verifier == name]
    said = _reference_ok(tmp_path, [log_with(verifier=name, reference=ref) for ref in refs])
    expected = [VERIFIERS[name].reference_problem(ref) is None for ref in refs]
    assert said == expected, [(json.dumps(r), s, e) for r, s, e in zip(refs, said, expected) if s != e]
    for ref, ok in zip(refs, expected):
        if not ok:  # the quarantine reason is the record's own words
            reason = explain("bad_reference", log_with(verifier=name, reference=ref), LogRules())
            assert reason == f"reference for verifier {name} {VERIFIERS[name].reference_problem(ref)}"


def _reference_ok(tmp_path, lines: list[str]) -> list[bool]:
    """The feature query's reference_ok for each line (the path every line can take)."""
    path = tmp_path / "refs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    con = duckdb.connect()
    (chunk, _), = read_chunks(path, 10_000, 1 << 20)
    con.register("lines", chunk)
    return [row[0] for row in con.execute(
        f"SELECT reference_ok FROM ({feature_sql(LogRules(), 'lines')}) ORDER BY line_no").fetchall()]


def test_every_scored_reference_gets_a_gold_completion_the_verifier_accepts():
    """A reference of an accepted shape with an answer is scored 1.0 on its own answer."""
    from verifiers import registry

    for ref in ({"answer": "42"}, {"answer": 42}, {"answer": -2.5}, {"answer": ["colour", 3]}):
        for name in ("math", "exact"):
            if VERIFIERS[name].reference_problem(ref) is None:
                assert registry.self_test(name, ref).reward == 1.0, (name, ref)
