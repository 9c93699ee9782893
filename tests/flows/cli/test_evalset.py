"""`flywheel evalset add`: an eval item's domain is routed by the configured domain map."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from flows.cli.app import app

runner = CliRunner()


def test_evalset_add_uses_the_configured_domain_map(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at the terminal width
    toml = tmp_path / "flywheel.toml"
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    items = tmp_path / "sums.jsonl"
    items.write_text(json.dumps({"id": "e1", "domain": "arith", "prompt": "What is 3+4?",
                                 "reference": {"answer": "7"}}) + "\n")
    unmapped = runner.invoke(app, ["evalset", "add", "sums", str(items)])
    assert unmapped.exit_code == 2 and "no verifier for domain 'arith'" in unmapped.output, unmapped.output
    toml.write_text('[cycle.curate.verifiers.domain_map]\narith = "math"\n')
    mapped = runner.invoke(app, ["evalset", "add", "sums", str(items)])
    assert mapped.exit_code == 0 and "registered sums" in mapped.output, mapped.output
    listed = runner.invoke(app, ["sql", "SELECT domain, verifier FROM eval_items", "--format", "csv"])
    assert listed.output.split() == ["domain,verifier", "arith,math"], listed.output


def test_a_bad_config_value_stops_evalset_add_with_its_path(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    toml = tmp_path / "flywheel.toml"
    toml.write_text('[cycle.curate.verifiers]\nmath_timeout_s = "soon"\n')
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    items = tmp_path / "sums.jsonl"
    items.write_text(json.dumps({"id": "e1", "domain": "math", "prompt": "What is 3+4?",
                                 "reference": {"answer": "7"}}) + "\n")
    done = runner.invoke(app, ["evalset", "add", "sums", str(items)])
    assert done.exit_code == 2, done.output
    assert "cycle.curate.verifiers.math_timeout_s = 'soon': expected a number" in done.output, done.output
    assert not (tmp_path / "home").exists()  # nothing opened, nothing written
