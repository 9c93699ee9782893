"""`flywheel sql`: reads the lake as a table, CSV or JSON; refuses anything that writes."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import current_snapshot, open_lake
from tasks.ingest.batch import IngestConfig, ingest_file
from tests.tasks.logs import MALFORMED, write_logs

runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch):
    from storage.settings import LakeSettings

    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    con = open_lake(LakeSettings(home=home))
    path = write_logs(tmp_path / "a.jsonl", 12, extra_lines=[MALFORMED["bad_ts"][0]])
    ingest_file(con, path, str(path), IngestConfig(chunk_lines=1000), "c1")
    snapshot = current_snapshot(con)
    path = write_logs(tmp_path / "b.jsonl", 5, seed=1)
    ingest_file(con, path, str(path), IngestConfig(chunk_lines=1000), "c2")
    con.close()
    return snapshot


def test_formats(home):
    table = runner.invoke(app, ["sql", "SELECT cycle_id, count(*) AS n FROM failure_logs GROUP BY 1 ORDER BY 1"])
    assert table.exit_code == 0, table.output
    assert "c1" in table.output and "12" in table.output and "c2" in table.output
    csv_out = runner.invoke(app, ["sql", "SELECT kind, reason FROM quarantine", "--format", "csv"])
    assert csv_out.output.splitlines()[0] == "kind,reason"
    assert csv_out.output.splitlines()[1].startswith("bad_ts,ts 'yesterday' is not an ISO-8601")
    js = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM lake.failure_logs", "-f", "json"])
    assert json.loads(js.output) == {"n": 17}


def test_a_long_result_shows_its_first_rows_and_says_how_many_there_are(home):
    shown = runner.invoke(app, ["sql", "SELECT line_no FROM failure_logs ORDER BY ALL", "--max-rows", "3"])
    assert shown.exit_code == 0, shown.output
    assert "(17 rows, 3 shown; --max-rows or --format csv for all)" in shown.output
    every = runner.invoke(app, ["sql", "SELECT line_no FROM failure_logs", "--format", "csv", "--max-rows", "3"])
    assert len(every.output.splitlines()) == 1 + 17


def test_snapshot_reads_the_past(home):
    result = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM failure_logs", "-f", "json",
                                 "--snapshot", str(home)])
    assert json.loads(result.output) == {"n": 12}


@pytest.mark.parametrize("statement", [
    "DROP TABLE failure_logs", "DELETE FROM failure_logs", "INSERT INTO quarantine SELECT * FROM quarantine",
    "UPDATE models SET status = 'production'", "CREATE TABLE x AS SELECT 1", "COPY failure_logs TO 'x.csv'",
    "CALL ducklake_expire_snapshots('lake', versions => [1])", "SELECT 1; DROP TABLE failure_logs",
    # DuckLake's maintenance is a SELECT away; cleanup deleted files before the catalog refused its commit
    "SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)",
    "EXPLAIN ANALYZE SELECT * FROM DUCKLAKE_DELETE_ORPHANED_FILES('lake', cleanup_all => true)",
    "WITH x AS (SELECT * FROM ducklake_merge_adjacent_files('lake')) SELECT count(*) FROM x",
    "SELECT * FROM query('SELECT * FROM ducklake_cleanup_old_files(''lake'')')",
])
def test_writes_are_refused_with_a_clear_message(home, statement):
    result = runner.invoke(app, ["sql", statement])
    assert result.exit_code == 2
    assert "read-only" in result.output or "exactly one SQL statement" in result.output
    check = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM failure_logs", "-f", "json"])
    assert json.loads(check.output) == {"n": 17}


def test_a_bad_query_is_an_error_not_a_traceback(home):
    result = runner.invoke(app, ["sql", "SELECT nope FROM failure_logs"])
    assert result.exit_code == 2 and "query failed" in result.output and "Traceback" not in result.output


def test_maintenance_a_select_calls_deletes_no_file(home, tmp_path):
    assert runner.invoke(app, ["lake", "maintain"]).exit_code == 0  # merged-away files wait out their grace
    files = sorted((tmp_path / "home" / "data").rglob("*.parquet"))
    scheduled = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM ducklake_list_files('lake', 'failure_logs')",
                                    "-f", "json"])
    assert json.loads(scheduled.output)["n"] < len(files)  # some files are only waiting to be deleted
    result = runner.invoke(app, ["sql", "SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)"])
    assert result.exit_code == 2 and "`flywheel lake maintain` runs DuckLake's maintenance" in " ".join(
        result.output.split())
    assert sorted((tmp_path / "home" / "data").rglob("*.parquet")) == files


def test_text_prints_as_written_never_as_markup(home):
    result = runner.invoke(app, ["sql", "SELECT 'xs[i + 1] - xs[i]' AS \"d[i]\", '[/x]' AS q, ':x: [red]' AS r"])
    assert result.exit_code == 0, result.output
    for text in ("xs[i + 1] - xs[i]", "d[i]", "[/x]", ":x: [red]"):
        assert text in result.output


def test_json_lines_keep_every_column_and_stay_json(home):
    query = ("SELECT 1 AS x, 2 AS x, 'nan'::DOUBLE AS n, '-inf'::DOUBLE AS i, from_hex('AA5C41') AS b, "
             "[1.5, 'nan'::DOUBLE] AS l")
    line = runner.invoke(app, ["sql", query, "-f", "json"]).output

    def refuse(name):
        raise ValueError(f"{name} in the output")

    assert json.loads(line, parse_constant=refuse) == {"x": 1, "x_1": 2, "n": None, "i": None, "b": "\\xAA\\x5CA",
                                                       "l": [1.5, None]}
    assert runner.invoke(app, ["sql", "SELECT from_hex('AA5C41') AS b", "-f", "csv"]).output == "b\n\\xAA\\x5CA\n"


def test_csv_lines_end_as_shell_lines_do(home):
    """csv's default CRLF reached a shell: `v=$(flywheel sql ... -f csv | tail -1)` held a \\r,
    and the next command was told of no model 'a6b0...\\r'. (CliRunner turns CRLF into LF, so
    the command runs as a user runs it.)"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "flows.cli.app", "sql", "SELECT line_no FROM failure_logs "
                           "ORDER BY line_no LIMIT 2", "-f", "csv"], capture_output=True, check=True)
    assert done.stdout == b"line_no\n1\n1\n"
