"""Per-line features for the Great Expectations suite, derived by DuckDB in one query.

DuckDB parses every line once (yyjson, in C++) and derives one row per line: byte
size, JSON-ness, field types, roles, content lengths, reference shape (the columns
the suite in tasks/ingest/checks.py checks), and beside them the `failure_logs`
columns, so nothing is parsed twice and Python never loops over lines.

Speed matters here (this query is most of an ingest's time), hence three habits:
a type is read from the first character of the re-serialised (minified) JSON value
instead of parsing the value again; a nested value (messages, reference, failure)
is parsed once for all its checks; and strings are compared as JSON text where that
is exact. Nothing here decides validity; the suite does.
"""
from __future__ import annotations

from tasks.ingest.checks import (MAX_DEPTH, MAX_DIGITS, OPTIONAL_TYPES, REFUSED_TEMPLATE_ARGS, REQUIRED_FIELDS,
                                 REQUIRED_TYPES, ROLES, SCALAR_TYPES, LogRules)

# Top-level fields pulled out of each line in one parse; later expressions read these
# small JSON values instead of re-parsing the whole line for every check.
# `chat_template_kwargs` comes last and counts in log_id only when it holds an argument, so
# the ids of logs without it are the ids they had before it was read (and the native
# scanner's, which leaves a line with it to this query).
HASHED = ("id", "ts", "model", "domain", "verifier", "messages", "response", "failure", "reference", "meta")
FIELDS = (*HASHED, "chat_template_kwargs")
# Columns of feature_sql's result that only feed failure_logs; GX checks the others.
LOG_ONLY = ("log_id", "request_id", "ts", "model", "messages", "response", "failure_kind", "failure_detail",
            "reference", "meta", "chat_template_kwargs")
# What reference checks read, in this order: ref_v[1..5] in feature_sql.
_REF_KEYS = ("answer", "entry_point", "tests", "solution", "schema")
_FIELD_PATHS = ", ".join(f"'$.{f}'" for f in FIELDS)
_FIELD_COLUMNS = ", ".join(f"v[{i + 1}] AS f_{name}" for i, name in enumerate(FIELDS))
_NO_FIELD = " AND ".join(f"v[{i + 1}] IS NULL" for i in range(len(FIELDS)))
_REF_PATHS = ", ".join(f"'$.{k}'" for k in _REF_KEYS)


# A message's text, over `m` (role, content, tool_calls as JSON; a JSON null content is
# NULL): the rule of tasks/ingest/checks.py: message_text. A string; a list of text parts
# joined by newlines (OpenAI's format; the gateway joins them so too); an assistant turn
# with tool calls and no content (null, or "" as some frameworks write it): the calls as
# the gateway writes them (signals.py).
_TEXT_PARTS_OK = """(left(m.content, 1) = '[' AND json_array_length(m.content) > 0
      AND list_bool_and(list_transform(json_extract(m.content, '$[*]'), p -> coalesce(
          json_extract_string(p, '$.type') = 'text' AND json_type(p, '$.text') = 'VARCHAR', false))))"""


def _calls_text(m: str) -> str:
    return f"""CASE WHEN {m}.role = '"assistant"' AND left({m}.tool_calls, 1) = '['
      AND json_array_length({m}.tool_calls) > 0 THEN to_json(list_transform(
        list_filter(json_extract({m}.tool_calls, '$[*]'), c -> json_type(c, '$.function') = 'OBJECT'),
        c -> json_object('name', json_extract(c, '$.function.name'),
                         'arguments', json_extract(c, '$.function.arguments'))))::VARCHAR END"""


def _calls_are_text(m: str) -> str:
    return f"""(({m}.content IS NULL OR {m}.content = '""') AND {_calls_text(m)} IS NOT NULL)"""


_MESSAGE_TEXT = f"""CASE WHEN {_calls_are_text("m")} THEN {_calls_text("m")}
    WHEN left(m.content, 1) = '"' THEN json_extract_string(m.content, '$')
    WHEN left(m.content, 1) = '[' THEN array_to_string(list_transform(json_extract(m.content, '$[*]'),
                                                 p -> json_extract_string(p, '$.text')), chr(10)) END"""


def json_type_sql(value: str) -> str:
    """json_type(value) for DuckDB-serialised JSON: the first character names the type
    (json_extract writes minified JSON); only numbers need the parser (BIGINT/UBIGINT/DOUBLE)."""
    return (f"CASE left({value}, 1) WHEN '\"' THEN 'VARCHAR' WHEN '{{' THEN 'OBJECT' WHEN '[' THEN 'ARRAY' "
            f"WHEN 'n' THEN 'NULL' WHEN 't' THEN 'BOOLEAN' WHEN 'f' THEN 'BOOLEAN' ELSE json_type({value}) END")


def feature_sql(rules: LogRules, source: str) -> str:
    """Per line of `source` (line_no, raw, nbytes, utf8_ok): GX features and failure_logs fields.

    A line that is not JSON makes try() yield NULL instead of failing the whole query.
    Each nested value is parsed once more, and only when it has the right type: the
    messages into (role, content) JSON pairs, the reference into the keys verifiers
    read, the failure into kind and detail.
    """
    of_failure = {"failure_kind": "fk[1]", "failure_detail": "fk[2]"}
    types = ",\n  ".join(f"{json_type_sql(of_failure.get(name) or f'f_{name}')} AS t_{name}"
                         for name in {**REQUIRED_TYPES, **OPTIONAL_TYPES})
    missing = " + ".join(f"(f_{name} IS NULL)::INT" for name in REQUIRED_FIELDS)
    return f"""
WITH parsed AS (
  -- over the size limit: refused for that first (suite order), never parsed (a huge JSON array)
  SELECT line_no, utf8_ok, nbytes, raw,
    CASE WHEN nbytes <= {rules.max_line_bytes} THEN try(json_extract(raw, [{_FIELD_PATHS}])) END AS v FROM {source}
), fields AS (
  SELECT line_no, utf8_ok, nbytes, v, v IS NOT NULL AND {_no_nan_sql()} AS is_json,
    CASE WHEN v IS NULL THEN 'INVALID' WHEN {_NO_FIELD} THEN json_type(raw) ELSE 'OBJECT' END AS top_type,
    {_python_reads_sql()}, {_FIELD_COLUMNS}
  FROM parsed
), nested AS (
  SELECT *,
  CASE WHEN top_type = 'OBJECT' THEN {missing} ELSE 0 END AS n_missing,
  -- an item that is not an object yields NULL role and content, so it fails the type check
  CASE WHEN left(f_messages, 1) = '[' THEN
    json_transform(f_messages, '[{{"role":"JSON","content":"JSON","tool_calls":"JSON"}}]') END AS msgs,
  CASE WHEN left(f_reference, 1) = '{{' THEN json_extract(f_reference, [{_REF_PATHS}]) END AS ref_v,
  CASE WHEN left(f_failure, 1) = '{{' THEN json_extract(f_failure, ['$.kind', '$.detail']) END AS fk,
  CASE WHEN left(f_chat_template_kwargs, 1) = '{{' THEN json_keys(f_chat_template_kwargs) END AS template_names,
  f_domain ->> '$' AS domain, f_verifier ->> '$' AS verifier, f_response ->> '$' AS response,
  TRY_CAST(f_ts ->> '$' AS TIMESTAMPTZ) AS ts
  FROM fields
), typed AS (
  SELECT *, {types},
  CASE WHEN f_messages IS NOT NULL THEN coalesce(len(msgs), 0) END AS n_messages,
  list_transform(msgs, m -> m.role) AS roles_json,
  list_transform(msgs, m -> {_MESSAGE_TEXT}) AS contents,
  list_bool_or(list_transform(msgs, m -> left(m.content, 1) = '[' OR {_calls_are_text("m")})) AS rewritten,
  coalesce(verifier, CASE domain {_verifier_of_domain(rules)} END) AS eff_verifier
  FROM nested
)
SELECT line_no, utf8_ok, is_json, depth_ok, digits_ok, top_type,
  nbytes <= {rules.max_line_bytes} AS size_ok,
  n_missing = 0 AS has_required,
  {", ".join(f"t_{n}" for n in {**REQUIRED_TYPES, **OPTIONAL_TYPES})},
  {_messages_sql(rules)},
  domain, verifier,
  {_reference_sql()} AS reference_ok,
  ts IS NOT NULL AS ts_ok,
  {_template_args_sql()} AS template_args_ok,
  -- failure_logs fields; log_id hashes the known fields as DuckDB re-serialises them,
  -- so whitespace and key order do not change it and unknown extra keys do not count
  sha256((CASE WHEN {_STORED_ARGS} IS NULL THEN v[1:{len(HASHED)}] ELSE v END)::VARCHAR) AS log_id,
  f_id ->> '$' AS request_id, ts, f_model ->> '$' AS model,
  {_stored_messages_sql()} AS messages, response,
  fk[1] ->> '$' AS failure_kind, fk[2] ->> '$' AS failure_detail,
  f_reference::VARCHAR AS reference,
  CASE WHEN t_meta = 'OBJECT' THEN f_meta::VARCHAR ELSE '{{}}' END AS meta,
  {_STORED_ARGS} AS chat_template_kwargs
FROM typed
"""


# The stored chat_template_kwargs: NULL when there are none (absent, null or {}: the
# template's defaults alike).
_STORED_ARGS = ("(CASE WHEN t_chat_template_kwargs = 'OBJECT' AND f_chat_template_kwargs::VARCHAR <> '{}' "
                "THEN f_chat_template_kwargs::VARCHAR END)")


def _template_args_sql() -> str:
    """Whether the chat template's arguments are ones rollouts may pass on: JSON scalars,
    under no name checks.REFUSED_TEMPLATE_ARGS holds, none named twice. A value of the
    wrong type is the type check's to refuse."""
    refused = ", ".join(f"'{name}'" for name in REFUSED_TEMPLATE_ARGS)
    return f"""CASE WHEN t_chat_template_kwargs = 'OBJECT' THEN
      len(list_distinct(template_names)) = len(template_names) AND NOT list_has_any(template_names, [{refused}])
      AND coalesce(list_bool_and(list_transform(json_extract(f_chat_template_kwargs, '$.*'),
                                                x -> left(x, 1) NOT IN ('[', '{{'))), true)
      ELSE true END"""


# The line with its strings blanked: what is left is JSON's structure, numbers and literals.
_SKELETON = "regexp_replace(raw, '\"(?:[^\"\\\\]|\\\\.)*\"', '\"\"', 'g')"


def _no_nan_sql() -> str:
    """Whether the line holds no NaN or Infinity outside its strings. DuckDB's parser and
    Python's json read them (Python's json.dumps writes them), but they are no JSON: a
    strict reader of the lake refuses the row, and a reference answer of NaN made a task
    that any reply of "NaN" solves. Only a line that has the letters is looked into."""
    return (f"(NOT (contains(raw, 'NaN') OR contains(raw, 'Infinity')) OR NOT regexp_matches({_SKELETON}, "
            "'(?:^|[^0-9A-Za-z_\"])-?(?:NaN|Infinity)(?:[^0-9A-Za-z_\"]|$)'))")


def _python_reads_sql() -> str:
    """depth_ok, digits_ok: whether Python's json reads the line as DuckDB did (checks.MAX_DEPTH,
    MAX_DIGITS). A line nests no deeper than it has opening brackets and holds no integer
    longer than its longest run of digits, so only the rare line with many brackets or a long
    run of digits (one RE2 pass each) is looked into: its strings blanked, its brackets matched
    against a pattern of MAX_DEPTH levels, its integers measured. Clean lines never come here
    (the native scanner bounds both). A line that is not JSON passes both: bad_json is its reason."""
    skeleton = _SKELETON
    many_brackets = f"regexp_matches(raw, '(?:[^\\[{{]*[\\[{{]){{{MAX_DEPTH + 1}}}')"
    return f"""CASE WHEN v IS NULL OR NOT {many_brackets} THEN true
      ELSE regexp_full_match(regexp_replace({skeleton}, '[^\\[\\]{{}}]', '', 'g'), '{_nesting(MAX_DEPTH)}') END
      AS depth_ok,
    -- a run of 1,000 digits (RE2's longest repeat) anywhere, a string's included, is rare
    CASE WHEN v IS NULL OR nbytes <= {MAX_DIGITS} OR NOT regexp_matches(raw, '[0-9]{{1000}}') THEN true
      -- an integer (a number with a fraction or an exponent is a float, which has no limit)
      ELSE NOT coalesce(list_bool_or(list_transform(regexp_extract_all({skeleton}, '[-+.eE0-9]+'),
        n -> length(ltrim(n, '-')) > {MAX_DIGITS} AND regexp_full_match(n, '-?[0-9]+'))), false) END AS digits_ok"""


def _nesting(depth: int) -> str:
    """A regular expression for brackets (only) nested at most `depth` levels: a bound makes
    the matching of brackets regular."""
    level = r"[\[{][\]}]"
    for _ in range(depth - 1):
        level = r"[\[{](?:" + level + r")*[\]}]"
    return f"(?:{level})*"


def _stored_messages_sql() -> str:
    """The messages as stored: each content as its text, so every later stage reads strings.

    A turn whose text is its tool calls keeps them only there (`tool_calls` dropped), so
    no chat template renders the calls twice. Lines with only string contents keep their
    messages as written.
    """
    return f"""CASE WHEN rewritten THEN to_json(list_transform(json_extract(f_messages, '$[*]'),
    (item, i) -> json_merge_patch(item, CASE WHEN {_calls_are_text("msgs[i]")}
      THEN json_object('content', contents[i], 'tool_calls', NULL)
      ELSE json_object('content', contents[i]) END)))::VARCHAR
    ELSE f_messages::VARCHAR END"""


def _verifier_of_domain(rules: LogRules) -> str:
    return " ".join(f"WHEN '{d}' THEN '{v}'" for d, v in rules.domain_map.items())


def _messages_sql(rules: LogRules) -> str:
    # Roles are compared as JSON text: DuckDB writes strings minimally escaped, so
    # '"user"' is exactly the value user however the line spelled it.
    roles = ", ".join(f"'\"{r}\"'" for r in ROLES)
    # trim() strips spaces only, so "c has a non-space character" is regexp '[^ ]'
    return f"""CASE WHEN t_messages = 'ARRAY' THEN
    -- coalesce: list_bool_and skips NULLs, and a message with no content (or an item that
    -- is no object) gives NULL, which would let it pass beside well-typed ones
    list_bool_and(list_transform(msgs, m -> coalesce(left(m.role, 1) = '"' AND (left(m.content, 1) = '"'
      OR {_TEXT_PARTS_OK} OR {_calls_are_text("m")}), false))) END
    AS messages_well_typed,
  list_bool_and(list_transform(roles_json, r -> r IN ({roles}))) AS roles_ok,
  n_messages >= 1 AND list_bool_and(list_transform(contents, c -> coalesce(regexp_matches(c, '[^ ]'), false)))
    AND list_contains(roles_json, '"user"') AS content_ok,
  n_messages <= {rules.max_messages}
    AND coalesce(list_sum(list_transform(contents, c -> length(c))), 0) <= {rules.max_content_chars}
    AND coalesce(length(response), 0) <= {rules.max_response_chars} AS size_limits_ok"""


def _reference_sql() -> str:
    """Whether the reference has what the line's verifier needs (ref_v = its values by
    _REF_KEYS): the fast path of each verifier's `reference_problem` (verifiers.registry),
    held to it by tests/tasks/ingest/test_reference_shapes.py."""
    scalar = ", ".join(repr(t) for t in SCALAR_TYPES)
    answer, entry_point, tests, solution, schema = (json_type_sql(f"ref_v[{i + 1}]") for i in range(len(_REF_KEYS)))
    return f"""CASE eff_verifier
    WHEN 'math' THEN coalesce({answer} IN ({scalar}), false)
    WHEN 'exact' THEN coalesce({answer} IN ({scalar}) OR ({answer} = 'ARRAY' AND json_array_length(ref_v[1]) > 0
         AND list_bool_and(list_transform(json_extract(ref_v[1], '$[*]'), e -> json_type(e) IN ({scalar})))), false)
    WHEN 'code' THEN coalesce({entry_point} = 'VARCHAR'
         AND regexp_full_match(ref_v[2] ->> '$', '[A-Za-z_][A-Za-z0-9_]*')
         AND {tests} = 'VARCHAR' AND contains(ref_v[3] ->> '$', 'def check')
         AND coalesce({solution}, 'VARCHAR') = 'VARCHAR', false)
    WHEN 'json_schema' THEN coalesce({schema} = 'OBJECT', false)
  END"""
