"""What a valid failure log is: a Great Expectations suite over per-line features.

Validation runs per chunk of lines in three vectorised steps:

1. DuckDB parses every line once (yyjson, in C++) and derives one feature row per
   line: byte size, JSON-ness, field types, roles, content lengths, reference shape,
   and beside them the `failure_logs` columns, so nothing is parsed twice.
2. The GX suite below checks those features; each expectation carries a `kind`.
   GX returns the failing row indices per expectation (result format COMPLETE).
3. A line's reason is its first failing expectation in suite order (a line that is
   not JSON also "lacks" every field; only "not valid JSON" is worth saying), worded
   by a Python `explain_*` function that looks at that one bad line.

Only bad lines reach Python's json module, so a clean file costs DuckDB + GX time.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import pandas as pd

REQUIRED_FIELDS = ("messages", "response", "domain", "reference", "ts", "model", "failure")
ROLES = ("system", "user", "assistant", "tool")
# Which reference keys each verifier needs (DESIGN.md: verifier spec).
_TEXT = ("VARCHAR",)
_SCALAR = ("VARCHAR", "BIGINT", "UBIGINT", "DOUBLE")
REQUIRED_TYPES = {  # json_type names DuckDB reports
    "messages": ("ARRAY",), "response": _TEXT, "domain": _TEXT, "reference": ("OBJECT",),
    "ts": _TEXT, "model": _TEXT, "failure": ("OBJECT",), "failure_kind": _TEXT,
}
OPTIONAL_TYPES = {"id": _TEXT, "meta": ("OBJECT", "NULL"), "verifier": _TEXT + ("NULL",),
                  "failure_detail": _TEXT + ("NULL",)}


@dataclass(frozen=True)
class LogRules:
    """Limits and vocabularies a failure log is checked against."""

    domain_map: dict[str, str] = field(default_factory=lambda: {
        "math": "math", "code": "code", "json": "json_schema"})
    """domain -> verifier; the keys are the known domains."""
    known_verifiers: tuple[str, ...] = ("math", "code", "json_schema", "exact")
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
    ]
    return spec


# Top-level fields pulled out of each line in one parse; later expressions read these
# small JSON values instead of re-parsing the whole line for every check.
FIELDS = ("id", "ts", "model", "domain", "verifier", "messages", "response", "failure", "reference", "meta")
# Columns of chunk_sql's result that GX checks; the rest become failure_logs columns.
LOG_COLUMNS = ("log_id", "request_id", "ts", "model", "domain", "verifier", "messages", "response",
               "failure_kind", "failure_detail", "reference", "meta")


def chunk_sql(rules: LogRules, source: str) -> str:
    """Per line of `source` (line_no, raw, utf8_ok): GX features and failure_logs fields.

    One JSON parse per line (json_extract with a list of paths); a line that is not
    JSON makes try() yield NULL instead of failing the whole chunk.
    """
    paths = ", ".join(f"'$.{f}'" for f in FIELDS)
    fields = ", ".join(f"v[{i + 1}] AS f_{name}" for i, name in enumerate(FIELDS))
    verifier_of_domain = " ".join(f"WHEN '{d}' THEN '{v}'" for d, v in rules.domain_map.items())
    sub = {"failure_kind": "json_type(f_failure, '$.kind')", "failure_detail": "json_type(f_failure, '$.detail')"}
    types = ",\n  ".join(f"{sub.get(name, f'json_type(f_{name})')} AS t_{name}"
                         for name in {**REQUIRED_TYPES, **OPTIONAL_TYPES})
    missing = " + ".join(f"(f_{name} IS NULL)::INT" for name in REQUIRED_FIELDS)
    roles = ", ".join(f"'{r}'" for r in ROLES)
    scalar = ", ".join(repr(t) for t in _SCALAR)
    return f"""
WITH parsed AS (
  SELECT line_no, utf8_ok, raw, strlen(raw) AS nbytes, try(json_extract(raw, [{paths}])) AS v
  FROM {source}
), fields AS (
  SELECT line_no, utf8_ok, nbytes, v IS NOT NULL AS is_json,
    CASE WHEN v IS NULL THEN 'INVALID'
         WHEN list_bool_and(list_transform(v, x -> x IS NULL)) THEN json_type(raw)
         ELSE 'OBJECT' END AS top_type,
    {fields}
  FROM parsed
), typed AS (
  SELECT *,
  CASE WHEN top_type = 'OBJECT' THEN {missing} ELSE 0 END AS n_missing,
  {types},
  json_array_length(f_messages) AS n_messages,
  json_type(f_messages, '$[*]') AS item_types,
  json_type(f_messages, '$[*].role') AS role_types,
  json_type(f_messages, '$[*].content') AS content_types,
  json_extract_string(f_messages, '$[*].role') AS roles,
  json_extract_string(f_messages, '$[*].content') AS contents,
  f_domain ->> '$' AS domain, f_verifier ->> '$' AS verifier, f_response ->> '$' AS response,
  f_ts ->> '$' AS ts_text
  FROM fields
), shaped AS (
  SELECT *, coalesce(verifier, CASE domain {verifier_of_domain} END) AS eff_verifier FROM typed
)
SELECT line_no, utf8_ok, is_json, top_type,
  nbytes <= {rules.max_line_bytes} AS size_ok,
  n_missing = 0 AS has_required,
  {", ".join(f"t_{n}" for n in {**REQUIRED_TYPES, **OPTIONAL_TYPES})},
  CASE WHEN t_messages = 'ARRAY' THEN
    list_bool_and(list_transform(item_types, t -> t = 'OBJECT'))
    AND len(role_types) = n_messages AND len(content_types) = n_messages
    AND list_bool_and(list_transform(role_types, t -> t = 'VARCHAR'))
    AND list_bool_and(list_transform(content_types, t -> t = 'VARCHAR')) END AS messages_well_typed,
  list_bool_and(list_transform(roles, r -> r IN ({roles}))) AS roles_ok,
  n_messages >= 1 AND list_min(list_transform(contents, c -> length(trim(c)))) >= 1
    AND list_contains(roles, 'user') AS content_ok,
  n_messages <= {rules.max_messages}
    AND coalesce(list_sum(list_transform(contents, c -> length(c))), 0) <= {rules.max_content_chars}
    AND coalesce(length(response), 0) <= {rules.max_response_chars} AS size_limits_ok,
  domain, verifier,
  CASE eff_verifier
    WHEN 'math' THEN coalesce(json_type(f_reference, '$.answer') IN ({scalar}), false)
    WHEN 'exact' THEN coalesce(json_type(f_reference, '$.answer') IN ({scalar}), false)
    WHEN 'code' THEN coalesce(json_type(f_reference, '$.entry_point') = 'VARCHAR'
         AND regexp_full_match(f_reference ->> '$.entry_point', '[A-Za-z_][A-Za-z0-9_]*')
         AND json_type(f_reference, '$.tests') = 'VARCHAR'
         AND contains(f_reference ->> '$.tests', 'def check')
         AND coalesce(json_type(f_reference, '$.solution'), 'VARCHAR') = 'VARCHAR', false)
    WHEN 'json_schema' THEN coalesce(json_type(f_reference, '$.schema') = 'OBJECT', false)
  END AS reference_ok,
  TRY_CAST(ts_text AS TIMESTAMPTZ) IS NOT NULL AS ts_ok,
  -- failure_logs fields; log_id hashes the known fields as DuckDB re-serialises them,
  -- so whitespace and key order do not change it and unknown extra keys do not count
  sha256(list_value({", ".join(f"f_{f}" for f in FIELDS)})::VARCHAR) AS log_id,
  f_id ->> '$' AS request_id, TRY_CAST(ts_text AS TIMESTAMPTZ) AS ts, f_model ->> '$' AS model,
  f_messages::VARCHAR AS messages, response,
  f_failure ->> '$.kind' AS failure_kind, f_failure ->> '$.detail' AS failure_detail,
  f_reference::VARCHAR AS reference,
  CASE WHEN json_type(f_meta) = 'OBJECT' THEN f_meta::VARCHAR ELSE '{{}}' END AS meta
FROM shaped
"""


_VALIDATORS: dict[str, tuple] = {}


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
    result = batch_definition.get_batch(batch_parameters={"dataframe": features}).validate(
        suite, result_format={"result_format": "COMPLETE"})
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
    if kind == "bad_encoding":
        return "not valid UTF-8: undecodable bytes are kept as U+FFFD in `raw`"
    if kind == "line_too_large":
        return f"line is {len(raw.encode()):,} bytes, over the {rules.max_line_bytes:,}-byte limit"
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"not valid JSON: {exc.msg} at column {exc.colno}"
    if kind == "not_object":
        return f"expected a JSON object per line, got a JSON {type(record).__name__}"
    if kind == "missing_field":
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        return f"missing required field{'s' if len(missing) > 1 else ''} {', '.join(f'`{m}`' for m in missing)}"
    return _EXPLAIN[kind](record, rules)


def _explain_wrong_type(record: dict, rules: LogRules) -> str:
    expected = {"messages": list, "response": str, "domain": str, "reference": dict, "ts": str,
                "model": str, "failure": dict}
    for name, kind in expected.items():
        if not isinstance(record.get(name), kind):
            return f"`{name}` must be {_json_name(kind)}, got {_json_name(type(record.get(name)))}"
    if not isinstance(record["failure"].get("kind"), str):
        return "`failure.kind` must be a string"
    for name, kind in {"id": str, "meta": dict, "verifier": str}.items():
        if record.get(name) is not None and not isinstance(record[name], kind):
            return f"`{name}` must be {_json_name(kind)}, got {_json_name(type(record[name]))}"
    if record["failure"].get("detail") is not None and not isinstance(record["failure"]["detail"], str):
        return "`failure.detail` must be a string"
    for i, message in enumerate(record["messages"]):
        if not isinstance(message, dict):
            return f"messages[{i}] must be an object with role and content, got {_json_name(type(message))}"
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                return f"messages[{i}].{key} must be a string, got {_json_name(type(message.get(key)))}"
    return "a field has the wrong type"


def _explain_bad_role(record: dict, rules: LogRules) -> str:
    for i, message in enumerate(record["messages"]):
        if message["role"] not in ROLES:
            return f"messages[{i}].role {message['role']!r} is not one of {', '.join(ROLES)}"
    return "a message has an unknown role"


def _explain_empty(record: dict, rules: LogRules) -> str:
    if not record["messages"]:
        return "`messages` is empty: a failure log needs the conversation"
    for i, message in enumerate(record["messages"]):
        if not message["content"].strip():
            return f"messages[{i}].content is empty"
    return "the conversation has no user message"


def _explain_too_large(record: dict, rules: LogRules) -> str:
    if len(record["messages"]) > rules.max_messages:
        return f"{len(record['messages'])} messages, over the limit of {rules.max_messages}"
    if len(record["response"]) > rules.max_response_chars:
        return f"response is {len(record['response']):,} characters, over {rules.max_response_chars:,}"
    total = sum(len(m["content"]) for m in record["messages"])
    return f"messages hold {total:,} characters, over the limit of {rules.max_content_chars:,}"


def _explain_domain(record: dict, rules: LogRules) -> str:
    return f"unknown domain {record['domain']!r}; known: {', '.join(rules.domain_map)}"


def _explain_verifier(record: dict, rules: LogRules) -> str:
    return f"unknown verifier {record['verifier']!r}; known: {', '.join(rules.known_verifiers)}"


def _explain_reference(record: dict, rules: LogRules) -> str:
    verifier = record.get("verifier") or rules.domain_map[record["domain"]]
    ref = record["reference"]
    if verifier in ("math", "exact"):
        return f"reference for verifier {verifier} needs `answer` (a string or number); has {sorted(ref)}"
    if verifier == "json_schema":
        return f"reference for verifier json_schema needs `schema` (an object); has {sorted(ref)}"
    if not isinstance(ref.get("entry_point"), str) or not ref["entry_point"].isidentifier():
        return "reference for verifier code needs `entry_point`, a Python identifier"
    if not isinstance(ref.get("tests"), str) or "def check" not in ref["tests"]:
        return "reference for verifier code needs `tests`, Python source defining check(candidate)"
    return "reference.solution must be a string of Python source"


def _explain_ts(record: dict, rules: LogRules) -> str:
    return f"ts {record['ts']!r} is not an ISO-8601 timestamp (e.g. 2026-11-30T12:00:00Z)"


def _json_name(kind: type) -> str:
    return {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
            bool: "a boolean", type(None): "null"}.get(kind, kind.__name__)


_EXPLAIN = {
    "wrong_type": _explain_wrong_type, "bad_role": _explain_bad_role,
    "empty_content": _explain_empty, "too_large": _explain_too_large,
    "unknown_domain": _explain_domain, "unknown_verifier": _explain_verifier,
    "bad_reference": _explain_reference, "bad_ts": _explain_ts,
}
