"""`flywheel evaluate [VERSION]`: one model against production, now, in this process.

The on-demand `evaluate` flow (flows/evaluate.py) run as `flywheel cycle` runs a cycle:
Prefect runs it without a server (a server's UI shows it when PREFECT_API_URL names
one). It prints pass@1 with its interval per evaluation set for both models and the
gate's decision, which changes `models` only with `--apply-gate`. VERSION naming the
production model scores it alone: the baseline a new model gets before any cycle, with
no gate. What is wrong before sampling starts (a bad flywheel.toml, no production model,
no evaluation set, an unknown VERSION, --apply-gate with production alone) is one line,
not a failed run.
"""
from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.table import Table

from flows.cli.show import cell, plain, print_error, rich_console


def evaluate_command(
    version: Annotated[str | None, typer.Argument(
        help="The model to compare with production (its version, or the first 6 or more characters of it); "
             "default: the newest candidate. Production's own version scores it alone (a baseline).")] = None,
    samples: Annotated[int | None, typer.Option(min=1, max=64, help=(
        "Samples per evaluation item. Default: \\[cycle.evaluate.engine] n."))] = None,
    apply_gate: Annotated[bool, typer.Option("--apply-gate", help=(
        "Promote or reject VERSION as the gate decides, as a cycle would; default: only report."))] = False,
    evaluation_id: Annotated[str | None, typer.Option("--id", help=(
        "Reuse an id to get its finished evaluation back instead of sampling again."))] = None,
) -> None:
    """Evaluate VERSION against production on every registered evaluation set; the gate decides."""
    console = rich_console()
    version, problem = _before_sampling(version, apply_gate)
    if problem:
        print_error(console, problem[0])
        raise typer.Exit(problem[1])
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.evaluate import EvaluateParams, evaluate_flow

    result = evaluate_flow(EvaluateParams(policy_version=version, evaluation_id=evaluation_id,
                                          eval_samples=samples, apply_gate=apply_gate))
    _print_result(console, result)


def _before_sampling(version: str | None, apply_gate: bool) -> tuple[str | None, tuple[str, int] | None]:
    """VERSION as the lake knows it (a prefix made whole), and why the evaluation cannot
    start with the exit code (2: the setup, 1: the lake's content), said before Prefect and
    the engines start."""
    from storage.config_file import ConfigError, lake_settings
    from storage.lake import LakeError, open_lake
    from tasks.cycle.config import cycle_config
    from tasks.release.models import ModelNotFound, pick_models

    try:
        cycle_config()  # a bad [cycle.evaluate] would otherwise fail the flow's first stage
        con = open_lake(lake_settings(), read_only=True)
    except (ConfigError, LakeError) as exc:
        return version, (str(exc), 2)
    try:
        picked = pick_models(con, version)  # the newest candidate when VERSION is left out
        version = version and picked["candidate"]
        if apply_gate and picked["candidate"] == picked["production"]:
            return version, (f"--apply-gate has nothing to apply: {version} is the production model, scored "
                             "alone (no gate); leave --apply-gate out for its baseline", 2)
        if not con.execute("SELECT count(*) FROM lake.eval_items").fetchone()[0]:
            return version, ("no evaluation set is registered: `flywheel evalset add NAME FILE` registers one "
                             "(HumanEval, MBPP and GSM8K files are read as published)", 1)
    except (ModelNotFound, ValueError) as exc:
        return version, (str(exc), 1)
    finally:
        con.close()
    return version, None


def _print_result(console, result: dict) -> None:
    from storage.config_file import lake_settings
    from storage.lake import open_lake
    from tasks.release.gate import GateConfig
    from tasks.reports.cycle_report import evaluation_table

    con = open_lake(lake_settings(), read_only=True)
    try:
        rows = evaluation_table(con, result["evaluation_id"], GateConfig())
    finally:
        con.close()
    alone = result["candidate"] == result["production"]
    console.print(f"evaluation {plain(result['evaluation_id'])}: " + (
        f"production {plain(result['production'])} alone (a baseline)" if alone else
        f"candidate {plain(result['candidate'])} against production {plain(result['production'])}"), soft_wrap=True)
    names = {result["candidate"]: "candidate", result["production"]: "production"}
    table = Table(title="pass@1 on clean items, with its interval")
    for name in ("model", "evaluation set", "items", "pass@1", "interval"):
        table.add_column(name, overflow="fold")
    for r in rows:
        table.add_row(*map(cell, (names.get(r["policy_version"], r["policy_version"]), r["eval_set"], r["items"],
                                  f"{r['pass@1']:.3f}", f"{r['low']:.3f}..{r['high']:.3f}")))
    console.print(table)
    _print_items_not_scored(console, result)
    if alone:
        console.print("gate: no comparison (production alone); models is unchanged", soft_wrap=True)
        return
    decision = result.get("decision") or {}
    verdict = "promote" if decision.get("promoted") else "reject"
    console.print(f"gate: {verdict}: {plain(decision.get('reason', 'no decision'))}", soft_wrap=True)
    applied = result.get("applied")
    console.print("applied to models: " + plain(applied["reason"]) if applied is not None
                  else "not applied (--apply-gate is off): models is unchanged", soft_wrap=True)


def _print_items_not_scored(console, result: dict) -> None:
    """What the table leaves out, so its item counts are not read as the whole set: items
    a training task copies (contaminated), and items a model could not be asked (a prompt
    too long for its context, or one its chat template refuses)."""
    if result.get("contaminated"):
        console.print(f"{result['contaminated']} contaminated items left out of both (a training task copies "
                      "them): flywheel sql \"SELECT * FROM evaluations WHERE contaminated\"", soft_wrap=True)
    for side, reasons in (result.get("left_out") or {}).items():
        if any(reasons.values()):
            said = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(reasons.items()) if n)
            console.print(f"{side}: items not sampled: {said} (trainer.engine.prompt_problems)", soft_wrap=True)
