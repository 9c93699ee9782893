"""The json_schema verifier on replies as real instruct models write them.

The object is found in prose, in a fence (tagged or not), after an explanation, before
a closing remark; replies that are not a valid instance (the schema echoed back, an
empty object, Python's dict repr, a wrong type, a missing or extra field, a guess list
of objects whose last one is invalid, the object wrapped in an array) do not pass. The
last object is the answer: one given after it, even "an example of an invalid object",
replaces it (verifiers/json_schema.py says why).
"""
from __future__ import annotations

import json

import pytest

from verifiers.registry import verify

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
SPEC = {"schema": SCHEMA}
ADA = '{"name": "Ada", "age": 36}'
ADA_PRETTY = json.dumps({"name": "Ada", "age": 36, "email": "ada@example.com"}, indent=2)

HONEST = [
    ADA,
    ADA_PRETTY,
    f"```json\n{ADA_PRETTY}\n```",
    f"```\n{ADA}\n```",
    f"```JSON\n{ADA}\n```",
    f"Here is the JSON object you asked for:\n\n```json\n{ADA_PRETTY}\n```",
    f"Sure! {ADA}",
    f"{ADA}\n\nLet me know if you need anything else.",
    f"The person's details as JSON: {ADA}. The age field is an integer.",
    f"Based on the text, the name is Ada and she is 36 years old. So the output is:\n{ADA}",
    '{"name": "Ada", "age": 36, "tags": ["math", "engines"]}',
    '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": []}',
    '{\n  "name": "Ada",\n  "age": 36\n}',
    '{"age": 36, "name": "Ada"}',
    '{"name": "Ada {the countess}", "age": 36}',
    '{"name": "Ada \\"the enchantress\\"", "age": 36}',
    f"Step 1: find the name (Ada).\nStep 2: find the age (36).\nStep 3: write JSON.\n\n{ADA}",
    f"I will fill in the fields {{name}} and {{age}}.\n{ADA}",
    f"Output:\n```json\n{ADA}\n```\nNote: `email` is optional, so I left it out.",
    f"Here is a first draft: {{\"name\": \"Ada\"}}\nOn reflection it needs the age too:\n{ADA}",
    '{"name":"Ada","age":36}',
    '{"name": "Ada", "age": 0}',
    '{"name": "李", "age": 36}',
    '{"name": "Ada", "age": 36, "email": "ada.lovelace+notes@example.co.uk"}',
    f"> {ADA}",
    f"**Answer:**\n\n```json\n{ADA_PRETTY}\n```\n\nThe object follows the schema.",
    f"The JSON is {ADA} (all required fields present).",
    f"Below is valid JSON.\n\n{ADA_PRETTY}\n\n---\nGenerated from the description above.",
    '  \n\n{"name": "Ada", "age": 36}\n\n  ',
    '{"name": "Ada", "age": 36, "tags": ["a", "b", "c"]}',
    f"```json\n{ADA}\n```\n```json\n{ADA_PRETTY}\n```",
    "\ufeff" + ADA,  # a byte-order mark, as a file written by some editors starts
    f"For example {{\"name\": \"Bob\", \"age\": 20}} fits the schema. For Ada:\n{ADA}",
    # Reasoning models: drafts and half objects in the thinking, the answer after it.
    f"<think>\nDraft: {{\"name\": \"Ada\", \"age\": \"36\"}}? age must be an integer.\n"
    f"Half: {{\"name\": \"Ada\", \"ag\n</think>\n\n{ADA}",
    f"The template opened the thinking. {{\"name\": 1}} is wrong.\n</think>\n\n```json\n{ADA_PRETTY}\n```",
    # Interleaved thinking: a draft in a later block does not displace the answer.
    f"<think>plan</think>{ADA}\n<think>Should age be a string? {{\"name\": \"Ada\", \"age\": \"36\"}}? "
    f"No, the schema says integer.</think>",
]

BAD = [
    ("the schema echoed back", json.dumps(SCHEMA), "wrong"),
    ("an empty object", "{}", "wrong"),
    ("Python's dict repr", "{'name': 'Ada', 'age': 36}", "format_error"),
    ("age as a string", '{"name": "Ada", "age": "36"}', "wrong"),
    ("a missing required field", '{"name": "Ada"}', "wrong"),
    ("an extra field", '{"name": "Ada", "age": 36, "admin": true}', "wrong"),
    ("a bad email", '{"name": "Ada", "age": 36, "email": "not-an-email"}', "wrong"),
    ("prose only", "The person is Ada, aged 36.", "format_error"),
    ("a guess list ending invalid", f'{ADA} or {{"name": "Ada", "age": "thirty-six"}}', "wrong"),
    ("a negative age", '{"name": "Ada", "age": -1}', "wrong"),
    ("an empty name", '{"name": "", "age": 36}', "wrong"),
    ("a truncated object", '{"name": "Ada", "age": 3', "format_error"),
    ("null fields", '{"name": null, "age": null}', "wrong"),
    # What a strict JSON parser (the reply's reader) rejects is no object.
    ("// comments", '```json\n{\n  "name": "Ada", // her name\n  "age": 36\n}\n```', "format_error"),
    ("a trailing comma", '```json\n{"name": "Ada", "age": 36,}\n```', "format_error"),
    ("typographic quotes", "{\u201cname\u201d: \u201cAda\u201d, \u201cage\u201d: 36}", "format_error"),
    ("NaN for a number", '{"name": "Ada", "age": NaN}', "format_error"),
    # The thinking is not the answer.
    ("the valid object only in the thinking", f"<think>\n{ADA}\n</think>\n\nI cannot share that.", "format_error"),
    ("a valid draft, an invalid answer", f'<think>\n{ADA}\n</think>\n{{"name": "Ada", "age": "36"}}', "wrong"),
    ("cut inside the thinking", f"<think>\nThe object is {ADA}, let me check the email", "format_error"),
    ("the valid object only in a <thinking> block", f"<thinking>\nDraft: {ADA}\n</thinking>\nI can't.",
     "format_error"),
    ("the valid object only in gpt-oss's analysis", f"<|channel|>analysis<|message|>{ADA}<|end|><|start|>assistant"
     "<|channel|>final<|message|>I cannot share that.<|return|>", "format_error"),
    ("cut inside a later think block", f"<think>x</think>Answer below.\n<think>\n{ADA}", "format_error"),
    # An array is what a program parsing the reply gets: no object, whatever it holds.
    ("the object wrapped in an array", f"[{ADA}]", "wrong"),
    ("candidate objects in an array", f'[{{"name": "Ada", "age": "36"}}, {ADA}]', "wrong"),
]


def test_the_sets_are_large_enough():
    assert len(HONEST) >= 30 and len(BAD) >= 10


@pytest.mark.parametrize("reply", HONEST)
def test_honest_replies_pass_wherever_the_object_is(reply):
    verdict = verify("json_schema", SPEC, reply)
    assert verdict.passed, (verdict.status, verdict.detail)


@pytest.mark.parametrize("why, reply, status", BAD, ids=[b[0] for b in BAD])
def test_invalid_or_gamed_replies_fail(why, reply, status):
    verdict = verify("json_schema", SPEC, reply)
    assert (verdict.passed, verdict.reward, verdict.status) == (False, 0.0, status), verdict.detail
