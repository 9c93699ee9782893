"""`flywheel cycle` and `flywheel model register` (flows/cli/cycle.py): what stops them before
anything is written."""
from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import open_lake
from storage.settings import LakeSettings

runner = CliRunner()


def test_a_cycle_without_a_production_model_is_refused_before_it_starts(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    open_lake(LakeSettings(home=home)).close()
    result = runner.invoke(app, ["cycle"])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1
    assert "no production model" in " ".join(result.output.split())
    con = open_lake(LakeSettings(home=home), read_only=True)
    assert con.execute("SELECT count(*) FROM cycles").fetchone()[0] == 0  # no cycle was begun


def test_registering_a_folder_that_is_not_a_model_is_a_clear_error_that_records_nothing(tmp_path, monkeypatch):
    home, folder = tmp_path / "home", tmp_path / "not-a-model"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    result = runner.invoke(app, ["model", "register", str(folder)])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1
    assert "is not a model flywheel can use" in " ".join(result.output.split())
    con = open_lake(LakeSettings(home=home), read_only=True)
    assert con.execute("SELECT count(*) FROM models").fetchone()[0] == 0


def test_a_landing_that_does_not_exist_is_refused_before_the_cycle_starts(tmp_path, monkeypatch):
    from flows.demo.tiny_model import init_model
    from tasks.release.models import register_model

    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "none.toml"))
    con = open_lake(LakeSettings(home=home))
    register_model(con, LakeSettings(home=home), init_model(tmp_path / "model"), "start")
    con.close()
    result = runner.invoke(app, ["cycle", "--landing", str(tmp_path / "no-such-landing")])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, result.output
    assert "no-such-landing: no such file or folder" in " ".join(result.output.split())
    con = open_lake(LakeSettings(home=home), read_only=True)
    assert con.execute("SELECT count(*) FROM cycles").fetchone()[0] == 0  # it failed as a run before
