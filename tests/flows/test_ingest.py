"""The ingest flow (what `flywheel ingest`, the scheduled deployment and webhook-triggered
runs start) takes [cycle.ingest] from flywheel.toml; a `chunk_lines` it is given wins."""
from __future__ import annotations

import pytest

import flows.ingest
from storage.config_file import ConfigError


@pytest.fixture
def ingested(monkeypatch):
    """The configs the flow hands its per-file task, without a lake or a Prefect run."""
    seen = []
    monkeypatch.setattr(flows.ingest, "discover_task", lambda paths: {"pending": list(paths), "unchanged": {}})
    monkeypatch.setattr(flows.ingest, "ingest_file_task", lambda uri, cfg, cycle_id: seen.append(cfg) or {"source_uri": uri})
    return seen


def test_the_flow_reads_the_file_and_a_given_chunk_lines_wins(tmp_path, monkeypatch, ingested):
    toml = tmp_path / "flywheel.toml"
    toml.write_text("[cycle.ingest]\nchunk_lines = 5000\n[cycle.ingest.rules]\nmax_content_chars = 300\n")
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    flows.ingest.ingest_flow.fn(["a.jsonl"])
    flows.ingest.ingest_flow.fn(["a.jsonl"], chunk_lines=2000)
    assert [cfg.chunk_lines for cfg in ingested] == [5000, 2000]
    assert [cfg.rules.max_content_chars for cfg in ingested] == [300, 300]  # the rest stays the file's


def test_a_given_chunk_lines_is_judged_by_ingests_own_bounds(tmp_path, monkeypatch, ingested):
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match=r"^cycle\.ingest\.chunk_lines = 10: chunk_lines must be within"):
        flows.ingest.ingest_flow.fn(["a.jsonl"], chunk_lines=10)
    assert ingested == []  # refused before any file was read
