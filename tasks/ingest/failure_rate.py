"""Production failure rate per model version, from what the gateway logged.

A call (an answered one: status 200) failed when it failed a signal of its own
(`interactions.failure_kinds`, tasks/ingest/signals.py) or a user said it was wrong
(negative `feedback`, with or without a correction). Negative feedback without a usable
correction counts as a failure but trains nothing; it is counted on its own so that the
share of failures the loop can learn from shows.

Tags: a request's `metadata` (the OpenAI field an application tags its calls with, logged
with the request) can narrow the calls counted (`tags`) and split the rate by one tag's
values (`by_tag`): per feature, tenant or batch of traffic, for example.

Not here: confidence intervals or comparisons between versions (the gate judges models on
evaluation sets, not on this rate), and feedback whose call is not in the lake yet.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

from storage.lake import open_lake
from storage.settings import LakeSettings

_RATE_SQL = """
WITH calls AS (
  SELECT completion_id, any_value(model_version) AS model_version,
         any_value(json_extract_string(request, $by_tag)) AS tag,
         bool_or(len(failure_kinds) > 0) AS signalled
  FROM lake.interactions WHERE status = 200 AND ($version IS NULL OR model_version = $version) {tag_filter}
  GROUP BY completion_id
), said AS (
  SELECT completion_id, bool_or(negative) AS negative, bool_or(negative AND NOT trainable) AS uncorrected
  FROM lake.feedback GROUP BY completion_id
)
SELECT model_version, tag, count(*) AS calls,
       count(*) FILTER (WHERE signalled OR coalesce(negative, false)) AS failed,
       count(*) FILTER (WHERE signalled) AS signal_failures,
       count(*) FILTER (WHERE negative) AS negative_feedback,
       count(*) FILTER (WHERE uncorrected) AS negative_without_correction
FROM calls LEFT JOIN said USING (completion_id)
GROUP BY model_version, tag ORDER BY model_version, tag NULLS LAST
"""


def production_failure_rate(settings: LakeSettings, model_version: str | None = None, *,
                            tags: Mapping[str, str] | None = None, by_tag: str | None = None) -> list[dict]:
    """Per model version (or the one given): `calls`, `failed` (a signal or negative
    feedback), `rate` = failed / calls, `signal_failures`, `negative_feedback`, and
    `negative_without_correction` (counted in `failed`, never a failure log).

    tags: count only calls whose request `metadata` has each of these values.
    by_tag: one row per version and value of this `metadata` key, which each row holds as
        `tag` (None for calls without it).
    """
    params: dict = {"version": model_version, "by_tag": None if by_tag is None else _metadata_path(by_tag)}
    conditions = []
    for i, (key, value) in enumerate((tags or {}).items()):
        conditions.append(f"AND json_extract_string(request, $tag_{i}) = $value_{i}")
        params |= {f"tag_{i}": _metadata_path(key), f"value_{i}": value}
    con = open_lake(settings, read_only=True)
    try:
        cursor = con.execute(_RATE_SQL.format(tag_filter=" ".join(conditions)), params)
        names = [column[0] for column in cursor.description]
        rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    finally:
        con.close()
    drop = set() if by_tag is not None else {"tag"}
    return [{**{k: v for k, v in row.items() if k not in drop}, "rate": row["failed"] / row["calls"]} for row in rows]


def _metadata_path(key: str) -> str:
    """The JSON path of `metadata[key]` in a logged request; the key is quoted, so any
    key is read as itself, never as a path."""
    return "$.metadata." + json.dumps(key)
