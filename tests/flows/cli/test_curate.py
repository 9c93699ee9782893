"""`flywheel curate`: decides every new log and points at the coverage table."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import open_lake
from storage.settings import LakeSettings
from tasks.ingest.batch import IngestConfig, ingest_file
from tests.tasks.logs import valid_log, write_logs

runner = CliRunner()


def test_curate_decides_logs_and_reports_coverage(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    logs = write_logs(tmp_path / "logs.jsonl", 8)
    con = open_lake(LakeSettings(home=home))
    ingest_file(con, logs, str(logs), IngestConfig(), "c1")
    con.close()
    first = runner.invoke(app, ["curate", "--cycle-id", "c1"])
    assert first.exit_code == 0, first.output
    assert "curated 8 logs" in first.output and "covered" not in first.output
    # An eval set registered later that copies a task's prompt: the next run records coverage.
    prompt = valid_log(3)["messages"][1]["content"]
    evalset = tmp_path / "sums.jsonl"
    evalset.write_text(json.dumps({"id": "e1", "domain": "math", "prompt": prompt,
                                   "reference": {"answer": "1"}}) + "\n")
    assert runner.invoke(app, ["evalset", "add", "sums", str(evalset)]).exit_code == 0
    second = runner.invoke(app, ["curate", "--cycle-id", "c2"])
    assert second.exit_code == 0, second.output
    assert "curated 0 logs" in second.output
    assert "1 eval items are covered by tasks in the lake" in second.output
    con = open_lake(LakeSettings(home=home), read_only=True)
    assert con.execute("SELECT item_id FROM lake.eval_coverage").fetchall() == [("e1",)]
    con.close()


def test_curate_follows_flywheel_toml(tmp_path, monkeypatch):
    """[cycle.curate] holds for `flywheel curate` as for the cycle: a low near-duplicate
    threshold makes the fixture's look-alike prompts near duplicates."""
    logs = write_logs(tmp_path / "logs.jsonl", 8)
    toml = tmp_path / "flywheel.toml"
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    outputs = {}
    for name, text in [("default", ""), ("loose", "[cycle.curate.minhash]\nthreshold = 0.2\nfp_similarity = 0.1\n")]:
        home = tmp_path / name
        monkeypatch.setenv("FLYWHEEL_HOME", str(home))
        toml.write_text(text)
        con = open_lake(LakeSettings(home=home))
        ingest_file(con, logs, str(logs), IngestConfig(), "c1")
        con.close()
        outputs[name] = runner.invoke(app, ["curate", "--cycle-id", "c1"]).output
    assert "near duplicate 0 " in outputs["default"], outputs["default"]
    assert "near duplicate 0 " not in outputs["loose"] and "near duplicate" in outputs["loose"], outputs["loose"]


def test_a_bad_curate_setting_stops_curate_before_it_opens_the_lake(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    toml = tmp_path / "flywheel.toml"
    toml.write_text("[cycle.curate]\nself_test_workers = 0\n")
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at the terminal width
    done = runner.invoke(app, ["curate"])
    assert done.exit_code == 2 and "cycle.curate: self_test_workers must be >= 1" in done.output, done.output
    assert not (tmp_path / "home").exists()
