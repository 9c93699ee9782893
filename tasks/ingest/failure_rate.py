"""Production failure rate per model version, from what the gateway logged.

A call (an answered one: status 200) failed when it failed a signal of its own
(`interactions.failure_kinds`, tasks/ingest/signals.py) or a user said it was wrong
(negative `feedback`, with or without a correction). Negative feedback without a usable
correction counts as a failure but trains nothing; it is counted on its own so that the
share of failures the loop can learn from shows.

Not here: confidence intervals or comparisons between versions (the gate judges models on
evaluation sets, not on this rate), and feedback whose call is not in the lake yet.
"""
from __future__ import annotations

from storage.lake import open_lake
from storage.settings import LakeSettings

_RATE_SQL = """
WITH calls AS (
  SELECT completion_id, any_value(model_version) AS model_version,
         bool_or(len(failure_kinds) > 0) AS signalled
  FROM lake.interactions WHERE status = 200 AND ($version IS NULL OR model_version = $version)
  GROUP BY completion_id
), said AS (
  SELECT completion_id, bool_or(negative) AS negative, bool_or(negative AND NOT trainable) AS uncorrected
  FROM lake.feedback GROUP BY completion_id
)
SELECT model_version, count(*) AS calls,
       count(*) FILTER (WHERE signalled OR coalesce(negative, false)) AS failed,
       count(*) FILTER (WHERE signalled) AS signal_failures,
       count(*) FILTER (WHERE negative) AS negative_feedback,
       count(*) FILTER (WHERE uncorrected) AS negative_without_correction
FROM calls LEFT JOIN said USING (completion_id)
GROUP BY model_version ORDER BY model_version
"""


def production_failure_rate(settings: LakeSettings, model_version: str | None = None) -> list[dict]:
    """Per model version (or the one given): `calls`, `failed` (a signal or negative
    feedback), `rate` = failed / calls, `signal_failures`, `negative_feedback`, and
    `negative_without_correction` (counted in `failed`, never a failure log)."""
    con = open_lake(settings, read_only=True)
    try:
        cursor = con.execute(_RATE_SQL, {"version": model_version})
        names = [column[0] for column in cursor.description]
        rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    finally:
        con.close()
    return [{**row, "rate": row["failed"] / row["calls"]} for row in rows]
