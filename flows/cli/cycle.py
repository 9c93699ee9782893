"""`flywheel cycle` runs one cycle now; `flywheel model register DIR` sets the starting model."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.show import plain, print_error, rich_console


def cycle_command(
    cycle_id: Annotated[str | None, typer.Option(help="Reuse a failed cycle's id to resume it.")] = None,
    landing: Annotated[list[str] | None, typer.Option(help="Override the landing path (repeatable).")] = None,
    rounds: Annotated[int, typer.Option(min=1)] = 1,
    tasks_per_round: Annotated[int | None, typer.Option(min=1, help="Default: \\[cycle.rollout] tasks_per_round.")] = None,
    samples_per_task: Annotated[int | None, typer.Option(min=2, help="Default: \\[cycle.rollout.engine] n.")] = None,
    max_staleness: Annotated[int | None, typer.Option(min=0, help=(
        "Rounds a sampling policy may lag the trained one; 0: synchronous. "
        "Default: \\[cycle.rollout] max_staleness."))] = None,
) -> None:
    """Run one flywheel cycle: ingest -> curate -> (rollout -> verify -> train) x rounds -> evaluate -> promote."""
    from storage.config_file import ConfigError, lake_settings
    from tasks.cycle.config import cycle_config
    from tasks.release.models import production_problem

    try:
        cycle_config()  # fail fast on a bad [cycle] in flywheel.toml, before Prefect starts
    except ConfigError as exc:
        print_error(rich_console(), exc)
        raise typer.Exit(2) from None
    if cycle_id is None and (problem := production_problem(lake_settings())):  # a resumed cycle knows its model
        print_error(rich_console(), problem)
        raise typer.Exit(1)
    if landing and (problem := _landing_problem(landing)):
        print_error(rich_console(), problem)
        raise typer.Exit(2)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.flywheel import CycleParams, flywheel_cycle

    summary = flywheel_cycle(CycleParams(cycle_id=cycle_id, landing=landing or [], rounds=rounds,
                                         tasks_per_round=tasks_per_round, samples_per_task=samples_per_task,
                                         max_staleness=max_staleness))
    print_summary(rich_console(), summary)


def print_summary(console, summary: dict) -> None:
    """The cycle's report (funnel, evaluation, the gate, the models it made: the summary.md
    the report stage wrote), then where each second went and where the report is."""
    from rich.markdown import Markdown

    report = Path(summary["report"]) / "summary.md"
    if report.is_file():
        console.print(Markdown(report.read_text()))
    seconds = ", ".join(f"{stage} {secs:.0f} s" for stage, secs in summary["stage_seconds"].items())
    console.print(f"cycle {plain(summary['cycle_id'])} {summary['status']} in {summary['busy_seconds']:.0f} s "
                  f"({seconds})", soft_wrap=True)
    console.print(f"report: {plain(summary['report'])}", soft_wrap=True)


def _landing_problem(landing: list[str]) -> str | None:
    """Why --landing cannot be read (a path that does not exist, a bucket refused), else
    None: said before Prefect starts, as `flywheel ingest` does, not as a failed run."""
    from storage.config_file import lake_settings
    from storage.objects import ObjectStoreError
    from tasks.ingest.sources import IngestError, discover_sources

    try:
        discover_sources(landing, lake_settings())
    except (IngestError, ObjectStoreError) as exc:
        return str(exc)
    return None


def model_register_command(
    model_dir: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="A Hugging Face model folder.")],
    reason: Annotated[str, typer.Option(help="Recorded in models.reason.")] = "registered by hand",
) -> None:
    """Record a model folder as the production model the next cycle starts from."""
    from storage.config_file import ConfigError, lake_settings
    from storage.lake import LakeError, open_lake
    from tasks.release.models import ModelFolderError, register_model

    try:
        settings = lake_settings()
        con = open_lake(settings)
    except (ConfigError, LakeError) as exc:
        print_error(rich_console(), exc)
        raise typer.Exit(2) from None
    try:
        version = register_model(con, settings, model_dir, reason)
    except ModelFolderError as exc:
        print_error(rich_console(), exc)
        raise typer.Exit(1) from None
    finally:
        con.close()
    rich_console().print(f"production model: {plain(version)}")
