"""The one config loader: every section ([lake], [schedule], [webhook], [cycle]) is read
by the same rules: unknown keys and ill-typed values are refused with their path, a
variable wins over the file, and the component's own checks judge the result."""
from __future__ import annotations

from pathlib import Path

import pytest

from flows.deployments import ScheduleConfig
from flows.webhook.app import WebhookConfig
from storage.config_file import ConfigError, lake_settings, load_section, load_toml
from tasks.cycle.config import cycle_config_from


@pytest.fixture(autouse=True)
def no_flywheel_variables(monkeypatch):
    for name in ("FLYWHEEL_HOME", "FLYWHEEL_S3_ENDPOINT", "FLYWHEEL_DUCKDB_THREADS", "FLYWHEEL_WEBHOOK_SECRET"):
        monkeypatch.delenv(name, raising=False)


def test_the_lake_keeps_its_short_variable_names_and_they_win(monkeypatch):
    toml = {"lake": {"home": "from-file", "duckdb_threads": 4}}
    assert (lake_settings(toml).home, lake_settings(toml).duckdb_threads) == (Path("from-file"), 4)
    monkeypatch.setenv("FLYWHEEL_HOME", "/from/env")
    monkeypatch.setenv("FLYWHEEL_DUCKDB_THREADS", "3")
    assert (lake_settings(toml).home, lake_settings(toml).duckdb_threads) == (Path("/from/env"), 3)


def test_a_home_written_with_a_tilde_is_the_users_home_not_a_folder_named_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert lake_settings({"lake": {"home": "~/.flywheel"}}).home == tmp_path / ".flywheel"
    monkeypatch.setenv("FLYWHEEL_HOME", "~/lakes/a")  # a .env file's value: no shell expanded it
    assert lake_settings({}).home == tmp_path / "lakes" / "a"


@pytest.mark.parametrize("toml, message", [
    ({"lake": {"hme": "x"}}, r"^lake\.hme is not a setting; known: home, s3_endpoint,"),
    # before the loaders were one, a string here reached DuckDB's SET threads
    ({"lake": {"duckdb_threads": "2"}}, r"^lake\.duckdb_threads = '2': expected an integer, not a string"),
    ({"lake": {"s3_endpoint": "http://minio:9000"}}, r"^lake: s3_endpoint must be host:port without a scheme"),
    ({"lake": 3}, r"^lake must be a table \(\[lake\] in flywheel\.toml\), not an integer"),
    ({"lake": {"duckdb_threads": 0}}, r"^lake: duckdb_threads must be at least 1, got 0"),
])
def test_a_bad_lake_setting_names_its_path(toml, message):
    with pytest.raises(ConfigError, match=message):
        lake_settings(toml)


def test_a_bad_variable_names_the_variable(monkeypatch):
    monkeypatch.setenv("FLYWHEEL_DUCKDB_THREADS", "many")
    with pytest.raises(ConfigError, match=r"^FLYWHEEL_DUCKDB_THREADS = 'many': expected an integer"):
        lake_settings({})
    monkeypatch.setenv("FLYWHEEL_HOME", "")  # Path("") is ".": the lake would land wherever one stands
    with pytest.raises(ConfigError, match=r"^FLYWHEEL_HOME is empty: name a folder"):
        lake_settings({})


def test_schedule_and_webhook_read_their_sections_and_variables(monkeypatch):
    monkeypatch.setenv("FLYWHEEL_SCHEDULE_INGEST_INTERVAL_S", "60")
    schedule = load_section(ScheduleConfig, "schedule", toml={"schedule": {"timezone": "Europe/Paris"}})
    assert (schedule.ingest_interval_s, schedule.timezone) == (60, "Europe/Paris")
    with pytest.raises(ConfigError, match=r"^schedule\.cron is not a setting"):
        load_section(ScheduleConfig, "schedule", toml={"schedule": {"cron": "0 2 * * *"}})
    # no valid webhook config exists without a secret: the loader builds none from defaults
    with pytest.raises(ConfigError, match=r"^webhook: FLYWHEEL_WEBHOOK_SECRET is empty"):
        load_section(WebhookConfig, "webhook", toml={})
    monkeypatch.setenv("FLYWHEEL_WEBHOOK_SECRET", "s" * 32)
    webhook = load_section(WebhookConfig, "webhook", toml={"webhook": {"replay_wait_s": 5}})
    assert webhook.secrets == ("s" * 32,) and webhook.replay_wait_s == 5.0


def test_a_list_setting_reads_from_a_variable_as_json():
    env = {"FLYWHEEL_CYCLE_INGEST_RULES_KNOWN_VERIFIERS": '["json_schema", "exact", "code", "math"]'}
    assert cycle_config_from({}, env=env).ingest.rules.known_verifiers == ("json_schema", "exact", "code", "math")
    with pytest.raises(ConfigError, match=r"^FLYWHEEL_CYCLE_INGEST_RULES_KNOWN_VERIFIERS = 'math': expected JSON"):
        cycle_config_from({}, env={"FLYWHEEL_CYCLE_INGEST_RULES_KNOWN_VERIFIERS": "math"})


def test_a_config_file_that_cannot_be_used_is_refused_with_why(tmp_path):
    misspelt = tmp_path / "misspelt.toml"
    misspelt.write_text("[lak]\nduckdb_threads = 1\n")  # its settings would have been lost in silence
    with pytest.raises(ConfigError, match=r"\[lak\] is not a section flywheel reads; known: lake, cycle,"):
        load_toml(misspelt)
    with pytest.raises(ConfigError, match="cannot be read as a TOML file: .*Is a directory"):
        load_toml(tmp_path)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("[cycle.gate]\n# Schwelle für\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="cannot be read as a TOML file: 'utf-8' codec"):
        load_toml(latin1)
    assert load_toml(tmp_path / "none.toml") == {}  # no file: every default
