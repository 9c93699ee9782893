"""The `flywheel` command line: one typer app, one line per command.

Each command's body lives in its own module of flows/ (`*_cmd.py`); this file only
wires names to functions so `flywheel --help` reads as the table of contents.
"""
import typer

from flows import ingest_cmd, sql_cmd

app = typer.Typer(
    name="flywheel",
    help="Turn a model's production failures into a better model.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

app.command("ingest")(ingest_cmd.ingest_command)
app.command("sql")(sql_cmd.sql_command)


if __name__ == "__main__":  # pragma: no cover - `python -m flows.cli`
    app()
