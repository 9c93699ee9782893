"""Tiny failure-log fixtures for ingest tests: valid logs and one line per malformed kind."""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path


def valid_log(i: int, seed: int = 0) -> dict:
    rng = random.Random(seed * 1_000_003 + i)
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return {"id": f"req-{seed}-{i}", "ts": "2026-11-30T12:00:00Z", "model": "policy-v3", "domain": "math",
            "messages": [{"role": "system", "content": "You are a calculator."},
                         {"role": "user", "content": f"What is {a}+{b}? (ticket {seed}-{i})"}],
            "response": str(a + b + 1), "failure": {"kind": "wrong_answer", "detail": "user marked incorrect"},
            "reference": {"answer": str(a + b)}, "meta": {"tenant": "acme"}}


def write_logs(path: Path, n: int, seed: int = 0, extra_lines: list[str] = ()) -> Path:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt") as handle:
        for i in range(n):
            handle.write(json.dumps(valid_log(i, seed)) + "\n")
        for line in extra_lines:
            handle.write(line + "\n")
    return path


def log_with(**changes) -> str:
    """One valid log's line with fields changed (or dropped: ABSENT)."""
    record = valid_log(0, seed=99)
    for key, value in changes.items():
        if value is ABSENT:
            record.pop(key)
        else:
            record[key] = value
    return json.dumps(record)


ABSENT = object()

# kind -> (line, a phrase the reason must contain)
MALFORMED = {
    "bad_json": ('{"id": "x", "ts": "2026-11-30T12:00:00Z", "messages": [', "not valid JSON"),
    "not_object": ('[1, 2, 3]', "expected a JSON object"),
    "missing_field": (log_with(messages=ABSENT), "missing required field `messages`"),
    "wrong_type": (log_with(messages="What is 2+2?"), "`messages` must be an array, got a string"),
    "bad_role": (log_with(messages=[{"role": "robot", "content": "hi"}]), "messages[0].role 'robot'"),
    "empty_content": (log_with(messages=[{"role": "user", "content": "   "}]), "messages[0].content is empty"),
    "too_large": (log_with(messages=[{"role": "user", "content": "x" * 40_000}]), "over the limit"),
    "line_too_large": (log_with(response="y" * 70_000), "over the 65,536-byte limit"),
    "unknown_domain": (log_with(domain="chemistry"), "unknown domain 'chemistry'"),
    "unknown_verifier": (log_with(verifier="vibes"), "unknown verifier 'vibes'"),
    "bad_reference": (log_with(reference={"solution": "4"}), "needs `answer`"),
    "bad_ts": (log_with(ts="yesterday"), "not an ISO-8601 timestamp"),
}
