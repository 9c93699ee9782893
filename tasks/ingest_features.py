"""Per-line features for the Great Expectations suite, derived by DuckDB in one query.

DuckDB parses every line once (yyjson, in C++) and derives one row per line: byte
size, JSON-ness, field types, roles, content lengths, reference shape (the columns
the suite in tasks/log_checks.py checks), and beside them the `failure_logs`
columns, so nothing is parsed twice and Python never loops over lines.

Speed matters here (this query is most of an ingest's time), hence two habits:
a type is read from the first character of the re-serialised (minified) JSON value
instead of parsing the value again, and a nested value (messages, reference) is
parsed once for all its checks. Nothing here decides validity; the suite does.
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

from tasks.log_checks import OPTIONAL_TYPES, REQUIRED_FIELDS, REQUIRED_TYPES, ROLES, SCALAR_TYPES, LogRules

# Top-level fields pulled out of each line in one parse; later expressions read these
# small JSON values instead of re-parsing the whole line for every check.
FIELDS = ("id", "ts", "model", "domain", "verifier", "messages", "response", "failure", "reference", "meta")
# Columns of feature_sql's result that only feed failure_logs; GX checks the others.
LOG_ONLY = ("log_id", "request_id", "ts", "model", "messages", "response", "failure_kind", "failure_detail",
            "reference", "meta")
# What reference checks read, in this order: ref_v[1..5] in feature_sql.
_REF_KEYS = ("answer", "entry_point", "tests", "solution", "schema")


def json_type_sql(value: str) -> str:
    """json_type(value) for DuckDB-serialised JSON: the first character names the type
    (json_extract writes minified JSON); only numbers need the parser (BIGINT/UBIGINT/DOUBLE)."""
    return (f"CASE left({value}, 1) WHEN '\"' THEN 'VARCHAR' WHEN '{{' THEN 'OBJECT' WHEN '[' THEN 'ARRAY' "
            f"WHEN 'n' THEN 'NULL' WHEN 't' THEN 'BOOLEAN' WHEN 'f' THEN 'BOOLEAN' ELSE json_type({value}) END")


def feature_sql(rules: LogRules, source: str) -> str:
    """Per line of `source` (line_no, raw, nbytes, utf8_ok): GX features and failure_logs fields.

    A line that is not JSON makes try() yield NULL instead of failing the whole query.
    """
    paths = ", ".join(f"'$.{f}'" for f in FIELDS)
    fields = ", ".join(f"v[{i + 1}] AS f_{name}" for i, name in enumerate(FIELDS))
    no_field = " AND ".join(f"v[{i + 1}] IS NULL" for i in range(len(FIELDS)))
    sub = {"failure_kind": "json_type(f_failure, '$.kind')", "failure_detail": "json_type(f_failure, '$.detail')"}
    types = ",\n  ".join(f"{sub.get(name) or json_type_sql(f'f_{name}')} AS t_{name}"
                         for name in {**REQUIRED_TYPES, **OPTIONAL_TYPES})
    missing = " + ".join(f"(f_{name} IS NULL)::INT" for name in REQUIRED_FIELDS)
    ref_paths = ", ".join(f"'$.{k}'" for k in _REF_KEYS)
    return f"""
WITH parsed AS (
  SELECT line_no, utf8_ok, nbytes, raw, try(json_extract(raw, [{paths}])) AS v FROM {source}
), fields AS (
  SELECT line_no, utf8_ok, nbytes, v IS NOT NULL AS is_json,
    CASE WHEN v IS NULL THEN 'INVALID' WHEN {no_field} THEN json_type(raw) ELSE 'OBJECT' END AS top_type,
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
  json_extract(f_reference, [{ref_paths}]) AS ref_v,
  f_domain ->> '$' AS domain, f_verifier ->> '$' AS verifier, f_response ->> '$' AS response,
  TRY_CAST(f_ts ->> '$' AS TIMESTAMPTZ) AS ts
  FROM fields
), shaped AS (
  SELECT *, coalesce(verifier, CASE domain {_verifier_of_domain(rules)} END) AS eff_verifier FROM typed
)
SELECT line_no, utf8_ok, is_json, top_type,
  nbytes <= {rules.max_line_bytes} AS size_ok,
  n_missing = 0 AS has_required,
  {", ".join(f"t_{n}" for n in {**REQUIRED_TYPES, **OPTIONAL_TYPES})},
  {_messages_sql(rules)},
  domain, verifier,
  {_reference_sql()} AS reference_ok,
  ts IS NOT NULL AS ts_ok,
  -- failure_logs fields; log_id hashes the known fields as DuckDB re-serialises them,
  -- so whitespace and key order do not change it and unknown extra keys do not count
  sha256(list_value({", ".join(f"f_{f}" for f in FIELDS)})::VARCHAR) AS log_id,
  f_id ->> '$' AS request_id, ts, f_model ->> '$' AS model,
  f_messages::VARCHAR AS messages, response,
  f_failure ->> '$.kind' AS failure_kind, f_failure ->> '$.detail' AS failure_detail,
  f_reference::VARCHAR AS reference,
  CASE WHEN t_meta = 'OBJECT' THEN f_meta::VARCHAR ELSE '{{}}' END AS meta
FROM shaped
"""


def _verifier_of_domain(rules: LogRules) -> str:
    return " ".join(f"WHEN '{d}' THEN '{v}'" for d, v in rules.domain_map.items())


def _messages_sql(rules: LogRules) -> str:
    roles = ", ".join(f"'{r}'" for r in ROLES)
    # trim() strips spaces only, so "length(trim(c)) >= 1" is "c has a non-space character"
    return f"""CASE WHEN t_messages = 'ARRAY' THEN
    list_bool_and(list_transform(item_types, t -> t = 'OBJECT'))
    AND len(role_types) = n_messages AND len(content_types) = n_messages
    AND list_bool_and(list_transform(role_types, t -> t = 'VARCHAR'))
    AND list_bool_and(list_transform(content_types, t -> t = 'VARCHAR')) END AS messages_well_typed,
  list_bool_and(list_transform(roles, r -> r IN ({roles}))) AS roles_ok,
  n_messages >= 1 AND list_bool_and(list_transform(contents, c -> regexp_matches(c, '[^ ]')))
    AND list_contains(roles, 'user') AS content_ok,
  n_messages <= {rules.max_messages}
    AND coalesce(list_sum(list_transform(contents, c -> length(c))), 0) <= {rules.max_content_chars}
    AND coalesce(length(response), 0) <= {rules.max_response_chars} AS size_limits_ok"""


def _reference_sql() -> str:
    """Whether the reference has what the line's verifier needs (ref_v = its values by _REF_KEYS)."""
    scalar = ", ".join(repr(t) for t in SCALAR_TYPES)
    answer, entry_point, tests, solution, schema = (json_type_sql(f"ref_v[{i + 1}]") for i in range(len(_REF_KEYS)))
    return f"""CASE eff_verifier
    WHEN 'math' THEN coalesce({answer} IN ({scalar}), false)
    WHEN 'exact' THEN coalesce({answer} IN ({scalar}), false)
    WHEN 'code' THEN coalesce({entry_point} = 'VARCHAR'
         AND regexp_full_match(ref_v[2] ->> '$', '[A-Za-z_][A-Za-z0-9_]*')
         AND {tests} = 'VARCHAR' AND contains(ref_v[3] ->> '$', 'def check')
         AND coalesce({solution}, 'VARCHAR') = 'VARCHAR', false)
    WHEN 'json_schema' THEN coalesce({schema} = 'OBJECT', false)
  END"""


def gx_frame(features: pa.Table) -> pd.DataFrame:
    """The features as pandas for GX, every column categorical or plain bool.

    GX copies the whole frame a few times per expectation; with object columns that
    dominates validation, with 1-byte category codes it is cheap. Category values
    and NULLs are unchanged, so every expectation sees the same values.
    """
    columns = {}
    for name, column in zip(features.column_names, features.columns):
        plain_bool = pa.types.is_boolean(column.type) and column.null_count == 0
        columns[name] = column if plain_bool else column.combine_chunks().dictionary_encode()
    return pa.table(columns).to_pandas()
