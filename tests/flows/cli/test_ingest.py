"""`flywheel ingest`: the ingest flow end to end, and a second run over the same landing folder."""
from __future__ import annotations

import json

from typer.testing import CliRunner

# `flywheel ingest` imports Prefect only when it runs, and Prefect's log handler keeps the
# sys.stderr of its import: inside runner.invoke, a stream closed when the call returns,
# so the next run's logging fails on it. Importing the flow first binds the handler to
# pytest's stream; a real `flywheel` process has one stderr throughout.
import flows.ingest  # noqa: F401
from flows.cli.app import app
from tests.tasks.logs import MALFORMED, valid_log, write_logs

runner = CliRunner()


def test_ingest_then_again_reads_nothing_twice(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    landing = tmp_path / "landing"
    landing.mkdir()
    write_logs(landing / "a.jsonl", 6, extra_lines=[MALFORMED["bad_json"][0]])
    write_logs(landing / "b.jsonl.gz", 4, seed=3)
    first = runner.invoke(app, ["ingest", str(landing)])
    assert first.exit_code == 0, first.output
    assert "ingested" in first.output and "6 rows, 1 quarantined" in first.output and "4 rows, 0" in first.output
    second = runner.invoke(app, ["ingest", str(landing)])
    assert second.exit_code == 0, second.output
    assert second.output.count("already ingested") == 2, second.output
    write_logs(landing / "c.jsonl", 2, seed=5)
    third = runner.invoke(app, ["ingest", str(landing)])
    assert third.output.count("already ingested") == 2 and "2 rows, 0 quarantined" in third.output, third.output
    lake = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM ingest_batches", "--format", "csv"])
    assert lake.output.split() == ["n", "3"], lake.output
    with open(landing / "a.jsonl", "a") as grows:  # the application appends two more failures
        grows.write("".join(json.dumps(valid_log(i, seed=9)) + "\n" for i in range(2)))
    fourth = runner.invoke(app, ["ingest", str(landing)])
    said = " ".join(fourth.output.split())  # rich wraps the line where its width ends
    assert "the lines it gained from line 8): 2 rows, 0 quarantined" in said, fourth.output


def test_ingest_follows_flywheel_toml(tmp_path, monkeypatch):
    """The rules in [cycle.ingest.rules] hold for `flywheel ingest` as for the cycle."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    toml = tmp_path / "flywheel.toml"
    toml.write_text("[cycle.ingest.rules]\nmax_content_chars = 300\n")
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    landing = tmp_path / "landing"
    landing.mkdir()
    short = [json.dumps(valid_log(i)) for i in range(10)]
    long = []
    for i in range(10):
        log = valid_log(i, seed=1)
        log["messages"][1]["content"] += " " + "please show every step. " * 20
        long.append(json.dumps(log))
    (landing / "mixed.jsonl").write_text("\n".join(short + long) + "\n")
    done = runner.invoke(app, ["ingest", str(landing)])
    assert done.exit_code == 0, done.output
    assert "10 rows, 10 quarantined" in done.output, done.output
    kinds = runner.invoke(app, ["sql", "SELECT DISTINCT kind FROM quarantine", "--format", "csv"])
    assert kinds.output.split() == ["kind", "too_large"], kinds.output


def test_a_bad_flywheel_toml_stops_ingest_before_it_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    toml = tmp_path / "flywheel.toml"
    toml.write_text("[cycle.ingest]\nchunk_lins = 5\n")
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    write_logs(tmp_path / "a.jsonl", 3)
    done = runner.invoke(app, ["ingest", str(tmp_path / "a.jsonl")])
    assert done.exit_code == 2 and "cycle.ingest.chunk_lins is not a setting" in done.output, done.output
    assert not (tmp_path / "home" / "catalog.sqlite").exists()  # nothing was opened, nothing written


def test_an_error_naming_a_long_path_prints_it_whole_on_one_line(tmp_path, monkeypatch):
    """rich wraps at the console's width (80 when piped) and folded a path mid-word: a
    piped log's path could not be grepped or copied."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    missing = tmp_path / ("landing-folder-with-a-long-name-" * 3) / "logs.jsonl"
    done = runner.invoke(app, ["ingest", str(missing)])
    assert done.exit_code != 0
    assert f"error: {missing}: no such file or folder\n" in done.output, done.output
