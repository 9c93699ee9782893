"""What a valid failure log is: a Great Expectations suite over per-line features.

Validation runs per chunk of lines in three vectorised steps:

1. DuckDB parses every line once (yyjson, in C++) and derives one feature row per
   line: byte size, JSON-ness, field types, roles, content lengths, reference shape
   (tasks/ingest/features.py).
2. The GX suite below checks those features; each expectation carries a `kind`.
   GX returns the failing row indices per expectation (result format COMPLETE).
   Every expectation is row-wise, so the caller validates each distinct feature
   row once and applies its verdict to every line that has it (tasks/ingest/batch.py).
3. A line's reason is its first failing expectation in suite order (a line that is
   not JSON also "lacks" every field; only "not valid JSON" is worth saying), worded
   by a Python `explain_*` function that looks at that one bad line.

Only bad lines reach Python's json module, so a clean file costs DuckDB + GX time.
"""
from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass, field

import pandas as pd

from tasks.ingest.signals import REASONING_FIELDS, tool_calls_text
from verifiers.registry import DEFAULT_DOMAIN_MAP, VERIFIERS

REQUIRED_FIELDS = ("messages", "response", "domain", "reference", "ts", "model", "failure")
ROLES = ("system", "user", "assistant", "tool")
# Which reference shape each verifier needs is its record's `reference_problem`
# (verifiers.registry); the feature query and the native scanner are fast paths of it.
_TEXT = ("VARCHAR",)
SCALAR_TYPES = ("VARCHAR", "BIGINT", "UBIGINT", "DOUBLE")
REQUIRED_TYPES = {  # json_type names DuckDB reports
    "messages": ("ARRAY",), "response": _TEXT, "domain": _TEXT, "reference": ("OBJECT",),
    "ts": _TEXT, "model": _TEXT, "failure": ("OBJECT",), "failure_kind": _TEXT,
}
# An integer id (database exports number their requests) is kept as its decimal text.
OPTIONAL_TYPES = {"id": _TEXT + ("BIGINT", "UBIGINT", "NULL"), "meta": ("OBJECT", "NULL"),
                  "verifier": _TEXT + ("NULL",), "failure_detail": _TEXT + ("NULL",),
                  "chat_template_kwargs": ("OBJECT", "NULL")}
# `chat_template_kwargs` names the chat template's own variables (Qwen3's enable_thinking),
# which rollouts pass to apply_chat_template as vLLM's chat endpoint does. These names are
# no template variable: apply_chat_template's parameters (they would change what is
# rendered or returned, not the template's text: tools, add_generation_prompt, tokenize...),
# the messages under the template's own name, and the special tokens the tokenizer hands
# the template (a value would replace the tokenizer's token in the text). A log setting one
# is refused, not passed on. tests/tasks/ingest/test_checks.py holds the list to the
# installed transformers' signature.
REFUSED_TEMPLATE_ARGS = (
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens")
# Every later stage reads the stored JSON with Python's json module, which DuckDB's parser
# outdoes: it recurses once per level (RecursionError near 1,000) and refuses an integer of
# more digits than int() takes (ValueError). Lines past these are refused here, not in curate.
# MAX_DEPTH is above the native scanner's own bound (64 levels inside a field), so a line it
# calls clean is within it.
MAX_DEPTH = 100
MAX_DIGITS = sys.int_info.default_max_str_digits


@dataclass(frozen=True)
class LogRules:
    """Limits and vocabularies a failure log is checked against."""

    domain_map: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_DOMAIN_MAP))
    """domain -> verifier; the keys are the known domains."""
    known_verifiers: tuple[str, ...] = tuple(VERIFIERS)
    max_line_bytes: int = 65_536
    max_messages: int = 64
    max_content_chars: int = 32_768
    """Summed over all messages of one log."""
    max_response_chars: int = 32_768

    def __post_init__(self) -> None:
        unknown = set(self.domain_map.values()) - set(self.known_verifiers)
        if unknown:
            raise ValueError(f"domain_map names unknown verifiers {sorted(unknown)}; known: {self.known_verifiers}")
        for name in ("max_line_bytes", "max_messages", "max_content_chars", "max_response_chars"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def _in_set(column: str, values) -> dict:
    return {"column": column, "value_set": list(values)}


def suite_spec(rules: LogRules) -> list[tuple[str, dict]]:
    """(kind, expectation) in the order that decides a line's reason.

    Numeric limits are compared in SQL (`size_ok`, ...) and checked here as flags:
    GX's pandas engine evaluates value-range expectations one Python call per row,
    set membership vectorised.
    """
    spec = [
        ("bad_encoding", _in_set("utf8_ok", [True])),
        ("line_too_large", _in_set("size_ok", [True])),
        ("bad_json", _in_set("is_json", [True])),
        ("too_deep", _in_set("depth_ok", [True])),
        ("number_too_long", _in_set("digits_ok", [True])),
        ("not_object", _in_set("top_type", ["OBJECT"])),
        ("missing_field", _in_set("has_required", [True])),
    ]
    for name, types in {**REQUIRED_TYPES, **OPTIONAL_TYPES}.items():
        spec.append(("wrong_type", _in_set(f"t_{name}", types)))
    spec += [
        ("wrong_type", _in_set("messages_well_typed", [True])),
        ("bad_role", _in_set("roles_ok", [True])),
        ("empty_content", _in_set("content_ok", [True])),
        ("too_large", _in_set("size_limits_ok", [True])),
        ("unknown_domain", _in_set("domain", rules.domain_map)),
        ("unknown_verifier", _in_set("verifier", rules.known_verifiers)),
        ("bad_reference", _in_set("reference_ok", [True])),
        ("bad_ts", _in_set("ts_ok", [True])),
        ("bad_template_args", _in_set("template_args_ok", [True])),
    ]
    return spec


_VALIDATORS: dict[str, tuple] = {}
_VERDICTS: dict[str, dict[tuple, str | None]] = {}
VERDICTS_KEPT = 100_000
"""Distinct feature rows remembered per rules; past this the memory starts afresh
(a stream of novel unknown-domain strings must not grow it without bound)."""


def known_verdicts(rules: LogRules) -> dict[tuple, str | None]:
    """This process's verdicts so far under `rules`: feature row -> first failing kind (None: valid).

    A verdict depends only on the feature row and the rules, so it holds for every
    later batch too: a long-running ingest worker asks GX about each shape of log once.
    """
    key = repr(rules)
    if len(_VERDICTS.get(key, ())) > VERDICTS_KEPT:
        _VERDICTS.pop(key, None)  # replaced, not cleared: a batch in another thread keeps its own
    return _VERDICTS.setdefault(key, {})


def forget_verdicts() -> None:
    """Drop every remembered verdict (tests that count GX calls start from here)."""
    _VERDICTS.clear()


def _gx_validator(rules: LogRules):
    """Build the GX suite once per process and rules (GX context setup is not free)."""
    key = repr(rules)  # rules hold a dict, so they are not hashable
    if key not in _VALIDATORS:
        _VALIDATORS[key] = _build_validator(rules)
    return _VALIDATORS[key]


def _build_validator(rules: LogRules):
    import great_expectations as gx

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = gx.data_context.types.base.ProgressBarsConfig(globally=False)
    batch_definition = (context.data_sources.add_pandas("failure_logs")
                        .add_dataframe_asset("chunk").add_batch_definition_whole_dataframe("all"))
    suite = gx.ExpectationSuite(name="failure_log")
    for order, (kind, exp) in enumerate(suite_spec(rules)):
        suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(
            column=exp["column"], value_set=exp["value_set"], meta={"kind": kind, "order": order}))
    return batch_definition, context.suites.add(suite)


def first_failures(features: pd.DataFrame, rules: LogRules) -> dict[int, str]:
    """{row position: kind} for every row that fails the suite (first failure wins)."""
    batch_definition, suite = _gx_validator(rules)
    # COMPLETE for the failing row indices; the pandas query text and sample values GX
    # would also build are not read (skipping them saves ~15% of a call)
    result = batch_definition.get_batch(batch_parameters={"dataframe": features}).validate(
        suite, result_format={"result_format": "COMPLETE", "return_unexpected_index_query": False,
                              "partial_unexpected_count": 0})
    failures: dict[int, tuple[int, str]] = {}
    for outcome in result.results:
        if outcome.success:
            continue
        if outcome.exception_info and outcome.exception_info.get("raised_exception"):
            raise RuntimeError(f"validation suite failed to run: {outcome.exception_info}")
        rank, kind = outcome.expectation_config.meta["order"], outcome.expectation_config.meta["kind"]
        for index in outcome.result.get("unexpected_index_list") or []:
            if index not in failures or failures[index][0] > rank:
                failures[index] = (rank, kind)
    return {index: kind for index, (_, kind) in failures.items()}


def explain(kind: str, raw: str, rules: LogRules) -> str:
    """A reason a person can act on, for one line that failed with `kind`."""
    if kind in ("bad_encoding", "bad_json") and raw.count("\x00") * 3 > len(raw):
        # UTF-16 splits into lines at each newline's first byte; no JSON line holds a raw zero byte
        name = "UTF-8" if kind == "bad_encoding" else "JSON"
        return f"not valid {name}: the file looks UTF-16 (Windows PowerShell writes it): save it as UTF-8"
    if kind == "bad_encoding":
        return "not valid UTF-8: undecodable bytes are kept as U+FFFD in `raw`"
    if kind == "line_too_large":
        # the commonest cause: logs written as one JSON array (json.dump(logs, f)), not JSON Lines
        array = raw[:64].lstrip().startswith("[")
        array = "; it starts with '[': ingest reads JSON Lines, one object per line" if array else ""
        return f"line is {len(raw.encode()):,} bytes, over the {rules.max_line_bytes:,}-byte limit{array}"
    if kind == "too_deep":
        return f"JSON nested more than {MAX_DEPTH} levels deep: later stages could not read it"
    if kind == "number_too_long":
        return f"a number has more than {MAX_DIGITS:,} digits: later stages could not read it (write it as a string)"
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:  # its msg ends "... starting at" for some errors
        return f"not valid JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}"
    except (RecursionError, ValueError):  # broken, and also too deep or too long a number for Python
        return "not valid JSON"
    if kind == "bad_json":
        return _explain_json_python_reads(raw)
    if kind == "not_object":
        return f"expected a JSON object per line, got a JSON {type(record).__name__}"
    if kind == "missing_field":
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        reason = f"missing required field{'s' if len(missing) > 1 else ''} {', '.join(f'`{m}`' for m in missing)}"
        return reason + _reply_in_messages(record) if "response" in missing else reason
    return _EXPLAIN[kind](record, rules)


def _reply_in_messages(record: dict) -> str:
    """A hint for a log without `response` whose messages end with the reply, as chat exports
    (OpenAI fine-tuning files among them) write a conversation."""
    messages = record.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if isinstance(last, dict) and last.get("role") == "assistant":
        return "; the last message is the assistant's: its reply goes in `response`, and `messages` ends before it"
    return ""


def _explain_json_python_reads(raw: str) -> str:
    """Why a line Python's json reads is refused: nearly always a lone UTF-16 surrogate
    escape, which a JavaScript exporter writes when it cuts an emoji in two (DuckDB's
    parser refuses it), or a NaN or Infinity (tasks/ingest/features.py: _no_nan_sql)."""
    if re.search(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}", raw):
        return "not valid JSON: a \\uD800-\\uDFFF escape that is not one half of a surrogate pair"
    if re.search(r"(?<![\w\"])-?(?:NaN|Infinity)(?![\w\"])", re.sub(r'"(?:[^"\\]|\\.)*"', '""', raw)):
        return ("not valid JSON: NaN and Infinity are not JSON numbers (Python's json.dumps writes them "
                "unless allow_nan=False): write null or a string")
    return "not valid JSON"


def _explain_wrong_type(record: dict, rules: LogRules) -> str:
    expected = {"messages": list, "response": str, "domain": str, "reference": dict, "ts": str,
                "model": str, "failure": dict}
    for name, kind in expected.items():
        if not isinstance(record.get(name), kind):
            return f"`{name}` must be {_json_name(kind)}, got {_json_name(type(record.get(name)))}"
    if not isinstance(record["failure"].get("kind"), str):
        return "`failure.kind` must be a string"
    request_id = record.get("id")
    if request_id is not None and not (isinstance(request_id, str) or type(request_id) is int):  # bool is an int
        return f"`id` must be a string or an integer, got {_json_name(type(request_id))}"
    if type(request_id) is int and not -2**63 <= request_id < 2**64:
        return "`id` is an integer past 64 bits: write it as a string"
    for name, kind in {"meta": dict, "verifier": str, "chat_template_kwargs": dict}.items():
        if record.get(name) is not None and not isinstance(record[name], kind):
            return f"`{name}` must be {_json_name(kind)}, got {_json_name(type(record[name]))}"
    if record["failure"].get("detail") is not None and not isinstance(record["failure"]["detail"], str):
        return "`failure.detail` must be a string"
    for i, message in enumerate(record["messages"]):
        if not isinstance(message, dict):
            return f"messages[{i}] must be an object with role and content, got {_json_name(type(message))}"
        if not isinstance(message.get("role"), str):
            return f"messages[{i}].role must be a string, got {_json_name(type(message.get('role')))}"
        if message_text(message) is None and message.get("content") is None:
            if message.get("function_call") is not None:
                return f"messages[{i}] has the legacy `function_call`: write it as `tool_calls`"
            if isinstance(message.get("refusal"), str):  # OpenAI's refusal field
                return f"messages[{i}] is a refusal with null content: put the refusal's text in `content`"
            if _reasoning_only(message):
                return f"messages[{i}] {REASONING_ONLY}"
        if message_text(message) is None:
            return f"messages[{i}].content {_content_problem(message.get('content'))}"
    return "a field has the wrong type"


def message_text(message: dict) -> str | None:
    """A message's content as text: a string; a non-empty list of text parts (OpenAI's
    `{"type": "text", "text": ...}`) joined by newlines; for an assistant turn with tool
    calls and no content (null, or ""), the calls as the gateway writes them
    (signals.tool_calls_text); None for anything else. tasks/ingest/features.py applies
    the same rule in SQL."""
    content, calls = message.get("content"), message.get("tool_calls")
    if content in (None, "") and message.get("role") == "assistant" and isinstance(calls, list) and calls:
        return tool_calls_text(calls)
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return None


REASONING_ONLY = ("holds only a reasoning model's thoughts (`reasoning_content`), no content: a turn cut at "
                  "max_tokens while thinking gave no answer; drop the turn or put its answer in `content`")


def _reasoning_only(message: dict) -> bool:
    """An assistant turn from a reasoning model (vLLM's `reasoning`, or `reasoning_content`)
    with thoughts and no answer: its text is not the reply, so it is not taken as one."""
    return message.get("role") == "assistant" and any(
        isinstance(message.get(name), str) and message[name].strip() for name in REASONING_FIELDS)


def _content_problem(content) -> str:
    if not isinstance(content, list):
        return (f"must be a string or a list of text parts (or, in an assistant turn with tool_calls, null), "
                f"got {_json_name(type(content))}")
    if not content:
        return "is an empty list of parts"
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            # an image or audio part: the task could not be replayed from text alone
            return f"part {j} is {kind!r}, not text: only text can be sampled and trained on"
        if not isinstance(part.get("text"), str):
            return f"part {j} has no string `text`"
    return "is not text"


def _explain_bad_role(record: dict, rules: LogRules) -> str:
    for i, message in enumerate(record["messages"]):
        if message["role"] not in ROLES:
            legacy = " (the legacy `function` role is `tool`)" if message["role"] == "function" else ""
            return f"messages[{i}].role {message['role']!r} is not one of {', '.join(ROLES)}{legacy}"
    return "a message has an unknown role"


def _explain_empty(record: dict, rules: LogRules) -> str:
    if not record["messages"]:
        return "`messages` is empty: a failure log needs the conversation"
    for i, message in enumerate(record["messages"]):
        if not message_text(message).strip():
            return f"messages[{i}] {REASONING_ONLY}" if _reasoning_only(message) else f"messages[{i}].content is empty"
    return "the conversation has no user message"


def _explain_too_large(record: dict, rules: LogRules) -> str:
    if len(record["messages"]) > rules.max_messages:
        return f"{len(record['messages'])} messages, over the limit of {rules.max_messages}"
    if len(record["response"]) > rules.max_response_chars:
        return f"response is {len(record['response']):,} characters, over {rules.max_response_chars:,}"
    total = sum(len(message_text(m)) for m in record["messages"])
    return f"messages hold {total:,} characters, over the limit of {rules.max_content_chars:,}"


def _explain_domain(record: dict, rules: LogRules) -> str:
    return f"unknown domain {record['domain']!r}; known: {', '.join(rules.domain_map)}"


def _explain_verifier(record: dict, rules: LogRules) -> str:
    return f"unknown verifier {record['verifier']!r}; known: {', '.join(rules.known_verifiers)}"


def _explain_reference(record: dict, rules: LogRules) -> str:
    verifier = record.get("verifier") or rules.domain_map[record["domain"]]
    return f"reference for verifier {verifier} {VERIFIERS[verifier].reference_problem(record['reference'])}"


def _explain_ts(record: dict, rules: LogRules) -> str:
    return f"ts {record['ts']!r} is not an ISO-8601 timestamp (e.g. 2026-11-30T12:00:00Z)"


def _explain_template_args(record: dict, rules: LogRules) -> str:
    args = record["chat_template_kwargs"]
    for name, value in args.items():
        if name in REFUSED_TEMPLATE_ARGS:
            return (f"`chat_template_kwargs` sets `{name}`, which is no variable of the chat template (an argument "
                    f"of apply_chat_template, the messages, or a special token): it would change more than the "
                    f"prompt's text; drop it")
        if isinstance(value, (dict, list)):
            return (f"`chat_template_kwargs.{name}` is {_json_name(type(value))}: template arguments are JSON "
                    f"scalars (a string, number, boolean or null)")
    return "`chat_template_kwargs` names one argument twice"


def _json_name(kind: type) -> str:
    return {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
            bool: "a boolean", type(None): "null"}.get(kind, kind.__name__)


_EXPLAIN = {
    "wrong_type": _explain_wrong_type, "bad_role": _explain_bad_role,
    "empty_content": _explain_empty, "too_large": _explain_too_large,
    "unknown_domain": _explain_domain, "unknown_verifier": _explain_verifier,
    "bad_reference": _explain_reference, "bad_ts": _explain_ts, "bad_template_args": _explain_template_args,
}
