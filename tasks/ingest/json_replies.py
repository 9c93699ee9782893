"""Whether a reply is the JSON object its request asked for: the check every signal shares.

The response-format signal (tasks/ingest/signals.py) and the tool-call signals
(tasks/ingest/tool_call_signals.py) judge a text against a JSON Schema alike, with the
`json_schema` verifier's own validation, so curation judges a derived log as ingest did.

Not here: which schema a reply answers to (each signal knows its own), or building logs.
"""
from __future__ import annotations

import json

from verifiers import json_schema

OBJECT_SCHEMA = {"type": "object"}
DETAIL_CHARS = 300
"""A failure's detail says what broke, not the whole reply."""


def object_problem(text: str, schema: dict) -> str | None:
    """Why `text` is not exactly one JSON object matching `schema`, or None."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return short(f"not JSON: {exc}")
    if not isinstance(value, dict):
        return f"not a JSON object: a JSON {_json_name(value)}"
    verdict = json_schema.verify({"schema": schema}, text)
    return None if verdict.passed else short(f"violates the schema: {verdict.detail}")


def usable_schema(schema) -> bool:
    """Whether the validator can judge by `schema`: one it cannot use judges nothing (the
    request was malformed, not the reply)."""
    return isinstance(schema, dict) and json_schema.schema_problem({"schema": schema}) is None


def json_text(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def short(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 3] + "..."


def _json_name(value) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(value), type(value).__name__)
