import json

from typer.testing import CliRunner

from flows.cli.app import app


def test_model_init_and_sft_from_the_command_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["model", "init", "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert 500_000 <= json.loads(result.output.strip().splitlines()[-1])["parameters"] <= 2_000_000
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1?", "completion": str(a + 1)}) + "\n" for a in range(8)))
    result = runner.invoke(app, ["model", "sft", "--model", str(tmp_path / "m"), "--data", str(data),
                                 "--out", str(tmp_path / "s"), "--steps", "3", "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["steps"] == 3
    assert (tmp_path / "s" / "model.safetensors").exists() and (tmp_path / "s" / "tokenizer.json").exists()
