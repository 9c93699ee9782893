"""`flywheel ingest`: the ingest flow end to end, and a second run over the same landing folder."""
from __future__ import annotations

from typer.testing import CliRunner

from flows.cli.app import app
from tests.tasks.logs import MALFORMED, write_logs

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
