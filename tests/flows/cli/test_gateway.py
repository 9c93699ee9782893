"""`flywheel gateway` (flows/cli/gateway.py): nothing to serve is one line of error before
the server starts, not uvicorn's startup traceback."""
import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.gateway.vllm_serve import free_port
from storage.lake import open_lake
from storage.settings import LakeSettings

runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("FLYWHEEL_GATEWAY_KEYS", "sk-test-client-0123456789abcdef")
    return tmp_path / "home"


def said(result) -> str:
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


def test_an_upstream_that_does_not_answer_is_named(home):
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["gateway", "--upstream", url, "--port", str(free_port())])
    assert f"error: upstream {url} is not healthy" in said(result) and "start it first" in said(result)


def test_managed_mode_without_a_lake_or_a_production_model_says_which(home):
    assert "no lake at" in said(runner.invoke(app, ["gateway", "--port", str(free_port())]))
    assert not home.exists()  # nothing written
    open_lake(LakeSettings(home=home)).close()
    assert "no production model" in said(runner.invoke(app, ["gateway", "--port", str(free_port())]))
