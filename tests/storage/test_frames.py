"""The notebook API: the lake's tables and queries as polars DataFrames, read-only."""
from __future__ import annotations

import polars as pl
import pytest

from storage import frames
from storage.lake import open_lake
from storage.query import ReadOnlyViolation
from tests.tasks.logs import write_logs


@pytest.fixture
def lake(lake_settings, tmp_path):
    from tasks.ingest.batch import IngestConfig, ingest_file

    con = open_lake(lake_settings)
    path = write_logs(tmp_path / "a.jsonl", 5)
    ingest_file(con, path, str(path), IngestConfig(), "c1")
    con.close()
    return lake_settings


def test_a_table_and_a_query_as_polars(lake):
    logs = frames.table("failure_logs", settings=lake)
    assert isinstance(logs, pl.DataFrame) and logs.height == 5
    assert logs.schema["ts"] == pl.Datetime("us", "UTC") and logs["domain"].to_list() == ["math"] * 5
    counts = frames.query("SELECT domain, count(*) AS n FROM failure_logs GROUP BY ALL", settings=lake)
    assert counts.to_dicts() == [{"domain": "math", "n": 5}]


def test_an_earlier_snapshot_and_the_errors_a_user_meets(lake):
    snapshots = frames.query("SELECT snapshot_id FROM ducklake_snapshots('lake') ORDER BY 1", settings=lake)
    before, last = (int(s) for s in snapshots["snapshot_id"][-2:])  # the batch is the last commit
    assert frames.table("failure_logs", snapshot=before, settings=lake).height == 0
    assert frames.table("failure_logs", snapshot=last, settings=lake).height == 5
    with pytest.raises(ValueError, match="no table 'failure_log'.*failure_logs"):
        frames.table("failure_log", settings=lake)
    with pytest.raises(ReadOnlyViolation, match="read-only"):
        frames.query("DELETE FROM failure_logs", settings=lake)
    assert "gate_decisions" in frames.tables()
