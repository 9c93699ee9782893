"""The `flywheel` command line: one typer app, one line per command.

Each command's body lives in its own module of flows/ (`*_cmd.py`); this file only
wires names to functions so `flywheel --help` reads as the table of contents.

Importing this file imports every command module, so those import what their command
runs (torch, Prefect, the stages) inside the command: `flywheel sql` and `--help` do not
wait seconds for libraries they never use (tests/flows/cli/test_app.py holds it).
"""
import typer

from flows.cli import curate as curate_cmd
from flows.cli import cycle as cycle_cmd
from flows.cli import evalset as evalset_cmd
from flows.cli import evaluate as evaluate_cmd
from flows.cli import gateway as gateway_cmd
from flows.cli import ingest as ingest_cmd
from flows.cli import lake as lake_cmd
from flows.cli import model as model_admin_cmd
from flows.cli import serve as serve_cmd
from flows.cli import sql as sql_cmd
from flows.cli import verify as verify_cmd
from flows.cli import webhook as webhook_cmd
from flows.demo import command as demo_cmd
from flows.demo import data_command as demo_data_cmd
from flows.demo import model_command as model_cmd

app = typer.Typer(
    name="flywheel",
    help="Turn a model's production failures into a better model.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

app.command("ingest")(ingest_cmd.ingest_command)
app.command("sql")(sql_cmd.sql_command)
app.add_typer(lake_cmd.lake_app, name="lake")
app.command("demo-data")(demo_data_cmd.demo_data_command)
app.command("verify")(verify_cmd.verify_command)
app.add_typer(evalset_cmd.evalset_app, name="evalset")
app.command("curate")(curate_cmd.curate_command)
app.command("serve")(serve_cmd.serve_command)
app.command("webhook")(webhook_cmd.webhook_command)
app.command("gateway")(gateway_cmd.gateway_command)
app.add_typer(model_cmd.model_app, name="model")
model_cmd.model_app.command("import")(model_admin_cmd.model_import_command)
model_cmd.model_app.command("list")(model_admin_cmd.model_list_command)
model_cmd.model_app.command("promote")(model_admin_cmd.model_promote_command)
model_cmd.model_app.command("register")(cycle_cmd.model_register_command)
app.command("cycle")(cycle_cmd.cycle_command)
app.command("evaluate")(evaluate_cmd.evaluate_command)
app.command("demo")(demo_cmd.demo_command)


if __name__ == "__main__":  # pragma: no cover - `python -m flows.cli.app`
    app()
