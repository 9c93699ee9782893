import json

import pytest
from typer.testing import CliRunner

from flows.cli.app import app

ROWS = [
    {"id": "m1", "verifier": "math", "spec": {"answer": "\\frac{1}{2}"}, "completion": "so \\boxed{0.5}"},
    "this line is not JSON",
    "",
    [1, 2, 3],
    {"id": "c1", "domain": "code", "spec": {"entry_point": "f", "tests": "def check(c):\n    assert c() == 1\n"},
     "completion": "```python\ndef f():\n    return 2\n```"},
    {"id": "e1", "verifier": "exact", "spec": {"answer": "Paris"}, "completion": "paris"},
]


def write_input(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in ROWS) + "\n")
    return path


def check_lines(lines):
    assert len(lines) == 5  # one per non-blank input line, in order
    assert [line.get("id") for line in lines] == ["m1", None, None, "c1", "e1"]
    assert [line["status"] for line in lines] == ["ok", "format_error", "format_error", "wrong", "ok"]
    assert "line 2: not JSON" in lines[1]["detail"] and "line 4" in lines[2]["detail"]
    assert lines[3]["verifier"] == "code" and lines[3]["latency_ms"] > 0


def test_verify_writes_one_verdict_line_per_input_line(tmp_path):
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["verify", str(write_input(tmp_path)), "--out", str(out)])
    assert result.exit_code == 0, result.output
    check_lines([json.loads(line) for line in out.read_text().splitlines()])
    assert "verified 5 rows: 2 passed" in result.output


def test_a_byte_order_mark_before_the_first_line_is_not_its_content(tmp_path):
    path = write_input(tmp_path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as Windows tools write UTF-8
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["verify", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    check_lines([json.loads(line) for line in out.read_text().splitlines()])


def test_verify_to_stdout_through_dask(tmp_path, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    result = CliRunner().invoke(app, ["verify", str(write_input(tmp_path)), "--dask", "--batch-size", "2", "--workers", "1"])
    assert result.exit_code == 0, result.output
    check_lines([json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")])


def test_missing_input_file_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2


def test_verify_uses_the_configured_domain_map_and_refuses_a_bad_one(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "a1", "domain": "arith", "spec": {"answer": "7"}, "completion": "\\boxed{7}"}))
    toml = tmp_path / "flywheel.toml"
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    unmapped = CliRunner().invoke(app, ["verify", str(path)])
    assert json.loads(unmapped.stdout.splitlines()[0])["status"] == "format_error", unmapped.output
    toml.write_text('[cycle.verify.verifiers.domain_map]\narith = "math"\n')
    mapped = CliRunner().invoke(app, ["verify", str(path)])
    line = json.loads(mapped.stdout.splitlines()[0])
    assert (line["verifier"], line["status"]) == ("math", "ok"), mapped.output
    toml.write_text('[cycle.verify.verifiers.domain_map]\narith = "abacus"\n')
    bad = CliRunner().invoke(app, ["verify", str(path), "--out", str(tmp_path / "out.jsonl")])
    assert bad.exit_code == 2 and "cycle.verify.verifiers: domain_map names unknown verifiers" in bad.output
    assert not (tmp_path / "out.jsonl").exists()


def test_a_field_of_the_wrong_type_costs_its_line_only(tmp_path):
    path = tmp_path / "in.jsonl"
    good = {"verifier": "exact", "spec": {"answer": "Paris"}, "completion": "Paris"}
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        good, {**good, "verifier": ["exact"]}, {"domain": {"name": "math"}, "spec": {"answer": "4"}, "completion": "4"},
        good]))
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["status"] for line in lines] == ["ok", "format_error", "format_error", "ok"]
    assert "verifier must be a string, got list" in lines[1]["detail"] and lines[1]["verifier"] == ""
    assert "domain must be a string, got dict" in lines[2]["detail"]


def test_a_spec_exported_from_the_lake_as_json_text_is_read_as_its_object(tmp_path):
    """`tasks.spec` is JSON text, and `flywheel sql --format json` exports it so: each such
    row was a format_error, whatever its completion."""
    path = tmp_path / "in.jsonl"
    exported = {"verifier": "math", "spec": json.dumps({"answer": "72"})}
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {**exported, "completion": "The answer is 72."}, {**exported, "completion": "The answer is 70."},
        {**exported, "spec": "{not json", "completion": "72"}]))
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["status"] for line in result.stdout.splitlines()] == ["ok", "wrong", "format_error"]


def test_undecodable_bytes_cost_their_line_only(tmp_path):
    path = tmp_path / "in.jsonl"
    good = json.dumps({"verifier": "exact", "spec": {"answer": "Paris"}, "completion": "Paris"}).encode()
    path.write_bytes(good + b"\n" + good.replace(b"Paris\"}", b"Par\xe9s\"}", 1) + b"\n" + good + b"\n")
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["status"] for line in lines] == ["ok", "format_error", "ok"]
    assert lines[1]["detail"].startswith("line 2: not valid UTF-8") and lines[1]["line"] == 2


@pytest.mark.parametrize("where, message", [
    ("missing/out.jsonl", "does not exist"),
    (".", "is a directory"),
])
def test_an_unwritable_out_path_is_refused_before_scoring(tmp_path, monkeypatch, where, message):
    scored = []
    monkeypatch.setattr("tasks.round.scoring.verify_row", lambda row, config: scored.append(row))
    result = CliRunner().invoke(app, ["verify", str(write_input(tmp_path)), "--out", str(tmp_path / where)])
    assert result.exit_code == 2 and "error: --out" in result.output and message in result.output, result.output
    assert scored == []


def test_out_may_be_the_input_file(tmp_path):
    path = write_input(tmp_path)
    result = CliRunner().invoke(app, ["verify", str(path), "--out", str(path)])
    assert result.exit_code == 0, result.output
    check_lines([json.loads(line) for line in path.read_text().splitlines()])
