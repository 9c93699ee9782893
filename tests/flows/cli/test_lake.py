"""`flywheel lake maintain`: what it says names the settings that govern it."""
from __future__ import annotations

from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import open_lake
from storage.settings import LakeSettings

runner = CliRunner()


def test_maintain_names_the_weights_setting_in_its_help_and_its_report(tmp_path, monkeypatch):
    # rich read `[maintenance]` as a style tag and printed "( model_weights_days)"
    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "absent.toml"))
    open_lake(LakeSettings(home=home)).close()
    help_text = " ".join(runner.invoke(app, ["lake", "maintain", "--help"]).output.split())
    assert "([maintenance] model_weights_days)" in help_text
    result = runner.invoke(app, ["lake", "maintain"])
    assert result.exit_code == 0, result.output
    assert "([maintenance] model_weights_days)" in " ".join(result.output.split())
