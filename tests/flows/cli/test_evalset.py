"""`flywheel evalset add`: an eval item's domain is routed by the configured domain map, and a
bad item refuses the whole file with its line named."""
from __future__ import annotations

import json

import pytest
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


@pytest.mark.parametrize("line, message", [
    (b'{"id": "b", "verifier": ["math"], "prompt": "Hi", "reference": {"answer": "1"}}',
     "line 2: verifier must be a string, got list"),
    (b'{"id": "b", "domain": "math", "prompt": "Hi", "reference": {"foo": "4"}}',
     "line 2: item 'b': reference for verifier 'math' needs `answer`"),
    (b'{"id": "b", "domain": "math", "prompt": "\xff", "reference": {"answer": "1"}}', "line 2: not valid UTF-8"),
])
def test_a_bad_item_refuses_the_file_naming_its_line(tmp_path, monkeypatch, line, message):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("COLUMNS", "200")
    items = tmp_path / "sums.jsonl"
    good = json.dumps({"id": "a", "domain": "math", "prompt": "What is 3+4?", "reference": {"answer": "7"}})
    items.write_bytes(good.encode() + b"\n" + line + b"\n")
    done = runner.invoke(app, ["evalset", "add", "sums", str(items)])
    assert done.exit_code == 2 and "error:" in done.output and message in done.output, done.output
    listed = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM eval_items", "--format", "csv"])
    assert listed.output.split() == ["n", "0"], listed.output  # nothing registered


def test_a_name_is_printed_as_written_and_listing_writes_nothing(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("COLUMNS", "200")
    empty = runner.invoke(app, ["evalset", "list"])
    assert empty.exit_code == 2 and "no lake at" in empty.output and not home.exists()  # no lake made to list
    items = tmp_path / "sums.jsonl"
    items.write_text(json.dumps({"id": "a", "domain": "math", "prompt": "What is 3+4?",
                                 "reference": {"answer": "7"}}) + "\n")
    # rich once read "[/x]" as markup: the add crashed after writing, and every list after it
    added = runner.invoke(app, ["evalset", "add", "sums[/x]", str(items)])
    assert added.exit_code == 0 and "registered sums[/x] version" in added.output, added.output
    listed = runner.invoke(app, ["evalset", "list"])
    assert listed.exit_code == 0 and "sums[/x]" in listed.output, listed.output
