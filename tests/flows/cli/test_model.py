"""`flywheel model list|promote` against a real lake; read-only commands before any lake exists."""
from datetime import datetime, timezone

import pyarrow as pa
from typer.testing import CliRunner

from flows.cli.app import app
from storage.lake import append_rows, open_lake, transaction
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings

runner = CliRunner()


def test_list_then_promote_by_hand(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps table cells at the terminal width
    con = open_lake(LakeSettings(home=home))
    rows = [{"policy_version": v, "parent_version": p, "uri": v, "status": s,
             "created_at": datetime(2026, 12, 1, h, tzinfo=timezone.utc), "cycle_id": "c"}
            for h, (v, p, s) in enumerate([("base", None, "production"), ("cand", "base", "rejected")])]
    with transaction(con):
        append_rows(con, "models", pa.Table.from_pylist(rows, schema=SCHEMAS["models"]))
    con.close()

    listed = runner.invoke(app, ["model", "list"])
    assert listed.exit_code == 0, listed.output
    assert "base" in listed.output and "rejected" in listed.output

    done = runner.invoke(app, ["model", "promote", "cand", "--reason", "gate too strict"])
    assert done.exit_code == 0, done.output
    assert "cand is now the production model (manual override); retired: base" in done.output
    listed = runner.invoke(app, ["model", "list"])
    assert "manual override: gate too strict" in listed.output

    missing = runner.invoke(app, ["model", "promote", "nope"])
    assert missing.exit_code == 1 and "no model 'nope'" in missing.output
    blank = runner.invoke(app, ["model", "promote", "base", "--reason", " "])
    assert blank.exit_code == 2 and "--reason must say why" in blank.output  # was stored as "manual override: "

    # a reason is the user's text: rich once read "[/x]" in it as markup, and every later list crashed
    assert runner.invoke(app, ["model", "promote", "base", "--reason", "[/x] back to [i] base :x:"]).exit_code == 0
    listed = runner.invoke(app, ["model", "list"])
    assert listed.exit_code == 0 and "manual override: [/x] back to [i] base :x:" in listed.output, listed.output


def test_before_anything_is_written_the_commands_say_so_and_create_nothing(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    for argv in (["model", "list"], ["sql", "SELECT 1"], ["cycle"]):
        result = runner.invoke(app, argv)
        assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), result.exception
        assert f"no lake at {home} yet" in " ".join(result.output.split()), (argv, result.output)
    assert not home.exists()



def test_import_of_a_folder_models_refuses_is_one_line(tmp_path, monkeypatch):
    """Whatever `models` refuses to record (tasks.release.models.ModelFolderError) after the
    conversion passed: exit 1 with its message, not a traceback."""
    import trainer.model_facts
    from flows.demo.tiny_model import init_model

    def refuse(model_dir):
        raise ValueError("config.json gives no context length")

    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(trainer.model_facts, "read_facts", refuse)
    result = runner.invoke(app, ["model", "import", str(init_model(tmp_path / "tiny"))])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert "is not a model flywheel can use" in " ".join(result.output.split())


def test_a_version_is_taken_by_a_unique_prefix_as_messages_show_it(tmp_path, monkeypatch):
    """Reasons and commit messages show a version's first 12 characters: promote takes
    those (6 or more), and a prefix two versions share is refused, never guessed."""
    home = tmp_path / "home"
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    con = open_lake(LakeSettings(home=home))
    versions = ["a1b2c3d4" + "0" * 56, "a1b2c3ff" + "1" * 56, "9f8e7d6c" + "2" * 56]
    rows = [{"policy_version": v, "uri": v, "status": s, "created_at": datetime(2026, 12, 1, h, tzinfo=timezone.utc),
             "cycle_id": "c"} for h, (v, s) in enumerate(zip(versions, ["production", "rejected", "rejected"]))]
    with transaction(con):
        append_rows(con, "models", pa.Table.from_pylist(rows, schema=SCHEMAS["models"]))
    con.close()
    done = runner.invoke(app, ["model", "promote", "9f8e7d6c2222", "--reason", "rollback"])
    assert done.exit_code == 0 and f"{versions[2]} is now the production model" in " ".join(done.output.split())
    shared = runner.invoke(app, ["model", "promote", "a1b2c3", "--reason", "x"])
    said = " ".join(shared.output.split())
    assert shared.exit_code == 1 and "'a1b2c3' starts 2 model versions (a1b2c3d400000000, a1b2c3ff11111111)" in said
    short = runner.invoke(app, ["model", "promote", "9f8e7", "--reason", "x"])  # 5 characters: too few to trust
    assert short.exit_code == 1 and "no model '9f8e7' in the lake" in short.output
    con = open_lake(LakeSettings(home=home), read_only=True)
    assert con.execute("SELECT policy_version FROM lake.models WHERE status = 'production'").fetchall() == [
        (versions[2],)]
