"""The gateway's log format: what `flywheel gateway` (flows/gateway/) writes and ingest reads.

The gateway appends one record per answered call and one per feedback to its spool,
and ships them, in spool order, as JSONL.gz files under `<landing>/gateway/`. A record
is one JSON object with `type`:

call
    id            the completion id the client received (`chatcmpl-...`; `resp_...`
                  for a Responses API call)
    api           absent for a chat completion; "responses" for a Responses API call,
                  whose request and response are that API's (tasks/ingest/responses_api.py)
    seq           the spool's sequence number (per gateway, increasing, never reused)
    gateway       the gateway's id (a spool keeps it across restarts)
    ts            when the request arrived, ISO 8601 UTC with `Z`
    model_version the model version that answered (the `models` table's policy_version)
    request       the request body as the client sent it (messages, response_format,
                  tools, sampling parameters); never the Authorization header
    response      the chat.completion the client received; a streamed answer is
                  assembled from its chunks into the same shape (a Responses call:
                  the `response` object, a stream's from its last event)
    status        HTTP status returned to the client (only 200 calls are answered calls)
    stream        whether the client asked for a stream
    latency_ms    from request received to response complete
    usage         the upstream's usage object, or null

feedback
    id            the completion id it is about: it joins to exactly one call
    seq, gateway, ts   as above
    label         "good" or "bad", or null
    score         a number in [0, 1], or null (at least one of label and score is set)
    correction    null, or what the answer should have been, one of:
                  {"answer": "72"}                 (math: the final answer)
                  {"object": {...}}                (a fixed JSON object)
                  {"tests": "def check(candidate): ...", "entry_point": "f",
                   "solution": "def f(...): ..."}  (code; solution optional)
                  optionally with "domain" to say which domain it is
    comment       free text, or null
    choice        which choice of the call's response it is about (its index; a call
                  with `n` > 1 has several); 0 when absent or null

Feedback is negative when its label is "bad" or its score is below `NEGATIVE_BELOW`.
"""
from __future__ import annotations

import json
from typing import Any

RECORD_TYPES = ("call", "feedback")
LABELS = ("good", "bad")
NEGATIVE_BELOW = 0.5
CORRECTION_KINDS = ("answer", "object", "tests")
FEEDBACK_FIELDS = ("id", "label", "score", "correction", "comment", "choice")
"""What a feedback body may hold (a feedback record adds type, seq, gateway and ts)."""
GATEWAY_FOLDER = "gateway/"
"""Shipped files live under `<landing>/gateway/<gateway id>/`."""


def is_gateway_record(line: bytes) -> bool:
    """Whether a JSON line is one of the records above (a call or a feedback, with the
    gateway and spool seq that wrote it): a failure log never has `type`, `gateway`, `seq`."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # nested past what Python's parser reads: no record of ours
        return False
    return (isinstance(record, dict) and record.get("type") in RECORD_TYPES
            and isinstance(record.get("gateway"), str) and isinstance(record.get("seq"), int))


def is_negative(feedback: dict) -> bool:
    """Whether a feedback record says the answer was wrong."""
    if feedback.get("label") == "bad":
        return True
    score = feedback.get("score")
    return score is not None and score < NEGATIVE_BELOW


def feedback_problem(body: Any) -> str | None:
    """Why a feedback body (as POSTed to /v1/feedback) is unusable, or None."""
    if not isinstance(body, dict):
        return "feedback must be a JSON object"
    if not isinstance(body.get("id"), str) or not body["id"]:
        return "needs `id`: the completion id the client received (chatcmpl-..., or resp_... from /v1/responses)"
    label, score = body.get("label"), body.get("score")
    if label is None and score is None:
        return "needs `label` (\"good\" or \"bad\") or `score` (a number in [0, 1])"
    if label is not None and label not in LABELS:
        return f"`label` must be one of {list(LABELS)}, got {label!r}"
    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1):
        return f"`score` must be a number in [0, 1], got {score!r}"
    if body.get("comment") is not None and not isinstance(body["comment"], str):
        return "`comment` must be a string"
    choice = body.get("choice")
    if choice is not None and (isinstance(choice, bool) or not isinstance(choice, int) or choice < 0):
        return f"`choice` must be the index of one of the call's choices (0, 1, ...), got {choice!r}"
    extra = set(body) - set(FEEDBACK_FIELDS)
    if extra:
        return f"unknown fields {sorted(extra)}; known: {', '.join(FEEDBACK_FIELDS)}"
    return correction_problem(body.get("correction"))


def correction_problem(correction: Any) -> str | None:
    """Why a feedback's `correction` is unusable, or None (None is a valid absent correction)."""
    if correction is None:
        return None
    if not isinstance(correction, dict):
        return "`correction` must be an object"
    kinds = [k for k in CORRECTION_KINDS if k in correction]
    if len(kinds) != 1:
        return f"`correction` needs exactly one of {list(CORRECTION_KINDS)}, has {sorted(correction)}"
    kind = kinds[0]
    if kind == "answer" and (isinstance(correction["answer"], bool)
                             or not isinstance(correction["answer"], str | int | float)):
        return "`correction.answer` must be a string or a number"
    if kind == "object" and not isinstance(correction["object"], dict | list):
        return "`correction.object` must be a JSON object or array"
    if kind == "tests":
        if not isinstance(correction["tests"], str) or "def check" not in correction["tests"]:
            return "`correction.tests` must be Python source defining check(candidate)"
        if not isinstance(correction.get("entry_point"), str) or not correction["entry_point"].isidentifier():
            return "`correction.entry_point` must name the function under test"
        if not isinstance(correction.get("solution", ""), str):
            return "`correction.solution`, when given, must be Python source"
    if correction.get("domain") is not None and not isinstance(correction["domain"], str):
        return "`correction.domain` must be a string"
    return None
