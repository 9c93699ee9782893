"""`flywheel evaluate` (flows/cli/evaluate.py): what stops it before anything is sampled.
The command's whole run is in tests/flows/test_evaluate_flow.py, beside the flow's."""
import json

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import append_rows, open_lake, transaction
from storage.settings import LakeSettings

runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A lake with a production model and a candidate of it, and no evaluation set."""
    from flows.demo.tiny_model import ModelConfig, init_model
    from tasks.release.models import folder_version, register_model
    from tasks.round.train import model_row

    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "none.toml"))
    settings = LakeSettings(home=home)
    con = open_lake(settings)
    production = register_model(con, settings, init_model(tmp_path / "prod"), "start")
    candidate = init_model(tmp_path / "cand", ModelConfig(seed=1))
    with transaction(con, "test: a candidate"):
        append_rows(con, "models", model_row(folder_version(candidate), production, str(candidate), "c0"))
    con.close()
    return {"home": home, "production": production, "tmp": tmp_path}


def _said(result) -> str:
    return " ".join(result.output.split())


def test_without_an_evaluation_set_it_says_how_to_register_one(home):
    result = runner.invoke(app, ["evaluate"])
    assert result.exit_code == 1 and "no evaluation set is registered: `flywheel evalset add" in _said(result)


def test_production_itself_an_unknown_model_or_a_bad_config_is_one_line_before_sampling(home, monkeypatch):
    evalset = home["tmp"] / "set.jsonl"
    evalset.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"}) + "\n")
    assert runner.invoke(app, ["evalset", "add", "gsm8k", str(evalset)]).exit_code == 0
    itself = runner.invoke(app, ["evaluate", home["production"][:12], "--apply-gate"])  # a prefix, as reasons show it
    assert itself.exit_code == 2 and (f"--apply-gate has nothing to apply: {home['production']} is the production "
                                      "model, scored alone") in _said(itself)
    unknown = runner.invoke(app, ["evaluate", "nope"])
    assert unknown.exit_code == 1 and "no model 'nope' in the lake" in _said(unknown)
    config = home["tmp"] / "flywheel.toml"
    config.write_text("[cycle.evaluate]\nk = 0\n")
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(config))
    bad = runner.invoke(app, ["evaluate"])
    assert bad.exit_code == 2 and "cycle.evaluate: k must be in" in _said(bad)
    con = open_lake(LakeSettings(home=home["home"]), read_only=True)
    assert con.execute("SELECT count(*) FROM evaluations").fetchone()[0] == 0  # nothing was sampled
