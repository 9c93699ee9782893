"""The native scan's fast path gives exactly the rows DuckDB's feature query gives.

Each line is derived both ways: through tasks/ingest/scan.py (the C scanner for clean
lines, the full query for the rest) and through the full query alone. Every column
(features, log_id, stored JSON text) must match for every line, over the demo data
(every planted malformation) and over hand-made edge cases: escapes, whitespace, key
order, floats, repeated keys, boundary sizes, the lenient JSON DuckDB accepts.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from flows.demo.data.generate import DemoDataConfig, generate_demo_data
from tasks.ingest.features import feature_sql
from tasks.ingest.lines import read_chunks
from tasks.ingest.scan import ScannedChunks, clean_features_sql, scan_lines, slow_lines
from tasks.ingest.checks import LogRules
from tests.tasks.logs import ABSENT, MALFORMED, log_with, valid_log

RULES = LogRules()


def _code_log() -> dict:
    return {"id": "req-c", "ts": "2026-11-30T12:00:00+01:00", "model": "m", "domain": "code",
            "messages": [{"role": "user", "content": "Write add(a, b)."}], "response": "def add(a, b): return a - b",
            "failure": {"kind": "test_failed"},
            "reference": {"entry_point": "add", "tests": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}}


def _json_log() -> dict:
    return {**valid_log(5), "domain": "json", "reference": {"schema": {"type": "object"}}}


def _raw(field: str, json_text: str, **changes) -> str:
    """A valid log whose `field` is spelled exactly `json_text`."""
    return log_with(**{field: "@@"}, **changes).replace('"@@"', json_text)


# Lines the fast path must take (clean), each spelling something DuckDB normalises.
CLEAN = {
    "plain": json.dumps(valid_log(0)),
    "minified": json.dumps(valid_log(2), separators=(",", ":")),
    "spaced": json.dumps(valid_log(3), indent=None, separators=(" ,  ", " :\t")),
    "reordered": json.dumps(dict(reversed(list(valid_log(4).items())))),
    "escapes": _raw("response", r'"caf\u00e9 \/ \ud83d\ude00 \u001f \t \u2028 é \" \\ \b\f\r\n \u00E9"'),
    "escaped_source": json.dumps(valid_log(6)).replace('"policy-v3"', '"\\u0070olicy\\/v3"'),
    "no_id_null_meta": log_with(id=ABSENT, meta=None),
    "no_meta": log_with(meta=ABSENT),
    "verifier_null": log_with(verifier=None),
    "verifier_exact": log_with(verifier="exact", reference={"answer": 7}),
    "detail_null": log_with(failure={"kind": "wrong_answer", "detail": None}),
    "no_detail": log_with(failure={"kind": "wrong_answer", "extra": [1, {"a": True}]}),
    "message_name": log_with(messages=[{"role": "user", "name": "ann", "content": "hi", "n": [1, -2]}]),
    "message_name_first": log_with(messages=[{"name": "ann", "tool_calls": [], "role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "?", "name": "bot"}]),
    "unknown_top_key": log_with(trace={"spans": [1, 2, {"x": None}]}),
    "big_int": log_with(meta={"n": 1234567890123456789, "m": -9223372036854775808}),
    "code": json.dumps(_code_log()),
    "json": json.dumps(_json_log()),
    "unknown_domain": log_with(domain="chemistry"),
    "unknown_verifier": log_with(verifier="vibes"),
    "ts_fraction": log_with(ts="2024-02-29T23:59:59.5Z"),
    "ts_micros_offset": log_with(ts="0001-01-01T00:00:00.000001-08:00"),
    "ts_max": log_with(ts="9999-12-31T23:59:59.999999+14:00"),
    "ts_escaped": _raw("ts", r'"2026-11-30T12:00:00\u002b05:30"'),
    "ts_space_nanos": log_with(ts="2026-11-30 12:00:00.999999999-03:00"),
    "wrong_answer_type": log_with(reference={"answer": True}),
    "bad_entry_point": json.dumps({**_code_log(), "reference": {"entry_point": "1add", "tests": "def check(c): pass"}}),
    "no_check": json.dumps({**_code_log(), "reference": {"entry_point": "add", "tests": "assert add(1, 2) == 3"}}),
    "solution_null": json.dumps({**_code_log(), "reference": {**_code_log()["reference"], "solution": None}}),
    "schema_not_object": json.dumps({**_json_log(), "reference": {"schema": "object"}}),
    "tab_content": log_with(messages=[{"role": "user", "content": "\t"}]),
    "reasoning_turn": log_with(messages=[{"role": "user", "content": "2+2?"},  # vLLM's reasoning parser's field
                                         {"role": "assistant", "reasoning_content": "Four.", "content": "4"},
                                         {"role": "user", "content": "Sure?"}]),
    "crlf": json.dumps(valid_log(7)) + "\r",
    "many_brackets_shallow": _raw("meta", '{"a": [' + "[[]]," * 200 + "[]]}"),
    "long_digit_string": log_with(meta={"n": "9" * 5000}),
    "nan_words_in_strings": log_with(response="NaN", meta={"NaN": "Infinity"}),
}

# Lines the fast path leaves to the full query: it must not claim them.
NOT_CLEAN = {
    "float": log_with(meta={"latency_s": 0.25}),
    "bad_ts": log_with(ts="yesterday"),
    "ts_feb_30": log_with(ts="2026-02-30T00:00:00Z"),
    "ts_no_offset": log_with(ts="2026-11-30T12:00:00"),
    "ts_lowercase": log_with(ts="2026-11-30t12:00:00z"),
    "ts_hour_24": log_with(ts="2026-11-30T24:00:00Z"),
    "ts_short_offset": log_with(ts="2026-11-30T12:00:00+05"),
    "exponent": log_with(reference={"answer": 1e5}),
    "minus_zero": _raw("meta", '{"z": -0}'),
    "huge_int": log_with(meta={"n": 10 ** 25}),
    "trailing_comma": json.dumps(valid_log(8))[:-1] + ",}",
    "nan": _raw("meta", '{"x": NaN}'),
    "infinity_answer": _raw("reference", '{"answer": -Infinity}'),
    "repeated_key": json.dumps(valid_log(9))[:-1] + ', "domain": "code"}',
    "repeated_role": _raw("messages", '[{"role": "user", "role": "tool", "content": "x"}]'),
    "nul": _raw("response", r'"a\u0000b"'),
    "lone_surrogate": _raw("response", r'"\ud800"'),
    "no_user": log_with(messages=[{"role": "system", "content": "s"}]),
    "blank": log_with(messages=[{"role": "user", "content": "   "}]),
    "empty_messages": log_with(messages=[]),
    "item_not_object": log_with(messages=["hi"]),
    "content_number": log_with(messages=[{"role": "user", "content": 5}]),
    "text_parts": log_with(messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                  {"type": "text", "text": "é\n"}]}]),
    "image_part": log_with(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
    "no_parts": log_with(messages=[{"role": "user", "content": []}]),
    "tool_call_turn": log_with(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo/é"}'}},
            "not a call"]},
        {"role": "tool", "tool_call_id": "t1", "content": "5C"}]),
    "empty_content_with_calls": log_with(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": "{}"}}]}]),
    "no_content_no_calls": log_with(messages=[{"role": "user", "content": "x"}, {"role": "assistant"}]),
    "reasoning_only_turn": log_with(messages=[{"role": "user", "content": "x"},
                                              {"role": "assistant", "content": None, "reasoning": "Hm."}]),
    "user_with_calls": log_with(messages=[{"role": "user", "content": None, "tool_calls": [{"function": {}}]}]),
    "id_number": log_with(id=5),
    "id_null": log_with(id=None),
    "id_negative": log_with(id=-5),
    "id_past_64_bits": log_with(id=2**64),
    "meta_array": log_with(meta=[1]),
    "verifier_number": log_with(verifier=3),
    "detail_number": log_with(failure={"kind": "x", "detail": 3}),
    "no_kind": log_with(failure={"detail": "x"}),
    "too_many_messages": log_with(messages=[{"role": "user", "content": "x"}] * 65),
    "content_over_limit": log_with(messages=[{"role": "user", "content": "é" * 32_769}]),
    "response_over_limit": log_with(response="x" * 32_769),
    "combining_at_limit": log_with(response="e\u0301" * 16_385),
    "top_array": "[1, 2]",
    "top_string": '"log"',
    "empty_object": "{}",
    "comment": json.dumps(valid_log(10)) + " /* c */",
    "trailing_garbage": json.dumps(valid_log(11)) + " x",
    "deep": log_with(meta={"a": json.loads("[" * 70 + "]" * 70)}),
    "deeper_than_the_limit": _raw("meta", '{"a": ' + "[{}," * 120 + '"]"' + "]" * 120 + "}"),
    "integer_past_int": _raw("meta", '{"n": -' + "9" * 4301 + "}"),
    "long_float": _raw("meta", '{"x": 1.' + "5" * 5000 + "e3}"),
}


def _rows_both_ways(tmp_path: Path, lines: list[bytes]) -> tuple[list, list, list[bool]]:
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    con = duckdb.connect()
    fast, slow, clean = [], [], []
    for chunk, _ in read_chunks(path, 10_000, 1 << 20):
        scanned = scan_lines(chunk, RULES)
        con.register("scanned", scanned)
        con.register("slow_lines", slow_lines(scanned))
        con.register("lines", chunk)
        both = f"""SELECT * FROM ({clean_features_sql(RULES, 'scanned')}
                   UNION ALL BY NAME SELECT * FROM ({feature_sql(RULES, 'slow_lines')})) ORDER BY line_no"""
        columns = [d[0] for d in con.execute(f"SELECT * FROM ({feature_sql(RULES, 'lines')}) LIMIT 0").description]
        fast += con.execute(f"SELECT {', '.join(columns)} FROM ({both})").fetchall()
        slow += con.execute(f"SELECT {', '.join(columns)} FROM ({feature_sql(RULES, 'lines')}) ORDER BY line_no").fetchall()
        clean += scanned.column("clean").to_pylist()
    return fast, slow, clean


def _assert_same(fast: list, slow: list, names: list[str]) -> None:
    assert len(fast) == len(slow) == len(names)
    for name, a, b in zip(names, fast, slow, strict=True):
        assert a == b, f"{name}: fast path {a} != full query {b}"


def test_edge_cases_give_the_full_querys_rows(tmp_path):
    cases = {**CLEAN, **NOT_CLEAN, **{f"malformed_{k}": line for k, (line, _) in MALFORMED.items()}}
    fast, slow, clean = _rows_both_ways(tmp_path, [line.encode() for line in cases.values()])
    _assert_same(fast, slow, list(cases))
    claimed = dict(zip(cases, clean, strict=True))
    assert [name for name in CLEAN if not claimed[name]] == []
    assert [name for name in NOT_CLEAN if claimed[name]] == []


def test_demo_data_gives_the_full_querys_rows(tmp_path):
    """Every demo line (valid logs, repeats, leaks, every planted malformation) both ways."""
    generate_demo_data(tmp_path / "demo", DemoDataConfig(logs=3000, seed=3))
    lines = [line for part in sorted((tmp_path / "demo" / "landing").iterdir())
             for line in _read(part).splitlines() if line.strip()]
    fast, slow, clean = _rows_both_ways(tmp_path, lines)
    _assert_same(fast, slow, [f"line {i + 1}" for i in range(len(lines))])
    assert sum(clean) > 0.9 * len(lines)  # the fast path carries the load


def test_undecodable_bytes_and_a_long_line_agree(tmp_path):
    lines = [json.dumps(valid_log(1)).replace("calculator", "calcul\xe9tor").encode("latin-1"),
             log_with(response="y" * 70_000).encode()]
    fast, slow, clean = _rows_both_ways(tmp_path, lines)
    _assert_same(fast, slow, ["latin-1", "over max_line_bytes"])
    assert slow[0][1] is False  # utf8_ok: the line is flagged, whichever path read it


def test_mutated_lines_give_the_full_querys_rows(tmp_path):
    """Seeded single-byte edits of valid logs (a quote, backslash, brace, comma, digit,
    space or letter inserted, dropped or replaced): whatever the scanner makes of
    them, the rows match."""
    rng = random.Random(11)
    alphabet = '"\\{}[],:0-.eE uU/nt\x01\xc3\xa9'
    lines = []
    for i in range(3000):
        base = json.dumps(rng.choice([valid_log(i), _code_log(), _json_log()]))
        at = rng.randrange(len(base))
        edit = rng.choice(("insert", "drop", "replace"))
        char = rng.choice(alphabet)
        lines.append((base[:at] + (char if edit != "drop" else "") + base[at + (edit != "insert"):]).encode())
    fast, slow, clean = _rows_both_ways(tmp_path, lines)
    _assert_same(fast, slow, [line.decode(errors="replace") for line in lines])
    assert 0.2 * len(lines) < sum(clean) < 0.95 * len(lines)  # both paths really exercised


_TEXTS = ["", " ", "x", "What is 2+2?", "caf\u00e9 \U0001f600", "q\"uote\\back/slash", "tab\tnew\nline\x01",
          "\u2028", "def check(candidate):\n    pass", "add", "1bad"]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["str", "int", "obj", "list", "bool", "null"] + (["float"] if rng.random() < 0.1 else []))
    if depth > 2 or kind == "str":
        return rng.choice(_TEXTS)
    return {"int": lambda: rng.choice([0, 7, -3, 2 ** 40, 2 ** 63 - 1]), "float": lambda: rng.choice([0.5, 1e20]),
            "bool": lambda: rng.random() < 0.5, "null": lambda: None,
            "obj": lambda: {rng.choice(_TEXTS): _random_value(rng, depth + 1) for _ in range(rng.randrange(3))},
            "list": lambda: [_random_value(rng, depth + 1) for _ in range(rng.randrange(3))]}[kind]()


def _shuffled(rng: random.Random, record: dict) -> dict:
    items = list(record.items())
    rng.shuffle(items)
    return dict(items)


def _random_log(rng: random.Random) -> dict:
    """A log that is mostly well-formed, with random key orders, extra keys, spellings and types."""
    log = rng.choice([valid_log(rng.randrange(100)), _code_log(), _json_log()])
    log["messages"] = [_shuffled(rng, {**({"name": rng.choice(_TEXTS)} if rng.random() < 0.3 else {}),
                                       "role": rng.choice(["user", "user", "assistant", "system", "tool", "bot"]),
                                       "content": rng.choice(_TEXTS[1:] + ["hello"] * 4)})
                       for _ in range(rng.randrange(1, 4))]
    for name in rng.sample(["id", "meta", "verifier", "reference", "failure", "response", "extra"], 2):
        log[name] = _random_value(rng) if rng.random() < 0.5 else log.get(name)
    for name in ("reference", "failure", "meta"):
        if isinstance(log.get(name), dict):
            log[name] = _shuffled(rng, log[name])
    return _shuffled(rng, {k: v for k, v in log.items() if v is not None or rng.random() < 0.5})


def test_random_logs_give_the_full_querys_rows(tmp_path):
    """Random key orders, extra keys, escapes (ensure_ascii spells every non-ASCII
    character as \\u escapes, astral ones as surrogate pairs), separators and types."""
    rng = random.Random(5)
    lines = [json.dumps(_random_log(rng), ensure_ascii=rng.random() < 0.5,
                        separators=rng.choice([(",", ":"), (", ", ": "), (" , ", " : ")])).encode()
             for _ in range(2000)]
    fast, slow, clean = _rows_both_ways(tmp_path, lines)
    _assert_same(fast, slow, [line.decode() for line in lines])
    assert 0.1 * len(lines) < sum(clean) < 0.9 * len(lines)  # both paths really exercised


def _random_ts(rng: random.Random) -> str:
    """ISO 8601 timestamps, mostly in the spelling the scanner converts, with impossible
    dates and times, odd fractions and offsets among them."""
    def part(usual: tuple[int, int], odd: list[int]) -> int:
        return rng.choice(odd) if rng.random() < 0.05 else rng.randint(*usual)
    day = f"{rng.choice([1, 1900, 1970, 2000, 2023, 2024, 2026, 9999]):04d}-{part((1, 12), [0, 13]):02d}-" \
          f"{part((1, 28), [0, 29, 30, 31, 32]):02d}"
    time_ = f"{part((0, 23), [24]):02d}:{part((0, 59), [60]):02d}:{part((0, 59), [60]):02d}"
    fraction = rng.choice(["", "", "", ".5", ".123", ".000001", ".999999", ".1234567", ".999999999", ".0000000001",
                           "."])
    offset = rng.choice(["Z"] * 6 + ["+00:00", "-00:00", "+05:30", "-08:00", "+14:00", "-14:59", "+15:00", "+05",
                                     "+0530", "z", "", "+23:59", "-12:60"])
    return day + rng.choice(["T"] * 8 + [" ", "t"]) + time_ + fraction + offset


def test_timestamps_give_the_full_querys_rows(tmp_path):
    """The scanner's own ts conversion (tasks/ingest/native/logscan_ts.h) against DuckDB's cast."""
    rng = random.Random(3)
    stamps = [_random_ts(rng) for _ in range(3000)]
    fast, slow, clean = _rows_both_ways(tmp_path, [log_with(ts=ts).encode() for ts in stamps])
    _assert_same(fast, slow, stamps)
    assert 0.2 * len(stamps) < sum(clean) < 0.8 * len(stamps)  # both paths really exercised
    assert all(not c or t[10] in "T " for t, c in zip(stamps, clean, strict=True))


@pytest.mark.parametrize("threads_split", [1, 2, 3, 10_001])
def test_chunking_does_not_change_rows(tmp_path, threads_split):
    """Lines split over Arrow chunks and thread halves give the same log ids as one pass."""
    lines = [json.dumps(valid_log(i)).encode() for i in range(threads_split)]
    fast, slow, _ = _rows_both_ways(tmp_path, lines)
    _assert_same(fast, slow, [str(i) for i in range(threads_split)])


def test_scan_rejects_spans_outside_its_data():
    from tasks.ingest.native import _logscan
    with pytest.raises(ValueError, match="outside the data"):
        _logscan.scan(b"{}", pa.array([0], pa.int64()).buffers()[1], pa.array([5], pa.int64()).buffers()[1],
                      64, 100, 100)


def _read(part: Path) -> bytes:
    import gzip
    return gzip.decompress(part.read_bytes()) if part.name.endswith(".gz") else part.read_bytes()


def test_read_ahead_yields_every_chunk_and_stops_when_closed(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(valid_log(i)) + "\n" for i in range(3000)))
    with ScannedChunks(path, RULES, 100, 1 << 20) as chunks:
        steps = list(chunks)
    assert sum(chunk.num_rows for chunk, _, _ in steps) == 3000
    assert [last for _, _, last in steps] == [False] * (len(steps) - 1) + [True]
    early = ScannedChunks(path, RULES, 100, 1 << 20)
    first, _, _ = next(iter(early))
    assert first.column("clean").to_pylist() == [True] * 100
    early.close()  # the reader is blocked on a full queue: closing must still end it
    assert not early._thread.is_alive()
    unread = ScannedChunks(path, RULES, 100, 1 << 20)
    unread.close()  # never iterated (a batch found already ingested)
    assert not unread._thread.is_alive()


def test_read_ahead_raises_the_readers_error_in_the_consumer(tmp_path):
    with ScannedChunks(tmp_path / "missing.jsonl", RULES, 100, 1 << 20) as chunks:
        with pytest.raises(FileNotFoundError):
            list(chunks)
