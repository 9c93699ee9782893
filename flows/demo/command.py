"""`flywheel demo` (= `make demo`): run the demo flow on a fresh home and print its table.

`--model smollm2` (or any HF folder or .gguf) runs the loop on a real instruct model
instead of the tiny one, sized for about 45 minutes on 2 cores (flows/demo/real_model.py).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli.show import cell, plain, rich_console


def demo_command(
    home: Annotated[Path, typer.Option(help="Fresh folder for the demo's lake (wiped first).")] = Path(".flywheel/demo"),
    model: Annotated[str, typer.Option(help=(
        "tiny: the ~1M-parameter model built here (about 20 minutes on 2 cores); smollm2, a HF folder or a "
        ".gguf: a real instruct model, imported (~45 minutes for SmolLM2-135M on 2 cores)."))] = "tiny",
    cycles: Annotated[int | None, typer.Option(min=1, max=10, help="Default: 3 (tiny), 2 (real model).")] = None,
    requests: Annotated[int | None, typer.Option(min=50, help=(
        "Production requests served per cycle. Default: 2000 (tiny), 400 (real model)."))] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help=(
        "rollout -> verify -> train rounds per cycle. Default: 2 (tiny), 1 (real model)."))] = None,
    sft_target: Annotated[float, typer.Option(min=0.01, max=1.0, help=(
        "SFT warms the tiny model until greedy decoding answers this share of held-out additions."))] = 0.5,
    routing: Annotated[bool, typer.Option(help=(
        "Route tasks by difficulty (adaptive sampling; unsolved tasks learned from their references). "
        "--no-routing: fixed G and plain GRPO, the baseline routing is measured against."))] = True,
) -> None:
    """Show the flywheel turning: serve, log failures, train, evaluate, promote — 3 times."""
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    os.environ["FLYWHEEL_HOME"] = str(home.resolve())
    os.environ["FLYWHEEL_CONFIG"] = str(home.resolve() / "flywheel.toml")  # written by demo_flow
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.demo.flow import DemoConfig, demo_flow
    from flows.demo.real_model import real_model_settings

    cfg = DemoConfig(sft_target=sft_target)
    if model != "tiny":
        cfg = real_model_settings(cfg, model)
    given = {"cycles": cycles, "rounds": rounds}
    cfg = replace(cfg, **{k: v for k, v in given.items() if v is not None})
    if requests is not None:
        cfg = replace(cfg, traffic=replace(cfg.traffic, requests=requests))
    if not routing:
        cfg = replace(cfg, toml=cfg.toml + NO_ROUTING_TOML)
    rows = demo_flow(cfg)
    print_demo_table(rows, home)


# The baseline: every task gets the whole group in one wave, unsolved tasks are dropped.
NO_ROUTING_TOML = """
[cycle.rollout.routing]
adaptive = false
sft = false
"""


def print_demo_table(rows: list[dict], home: Path) -> None:
    table = Table(title="flywheel demo: production failure rate per cycle, overall and per domain (95% CI), "
                        "as the lake measured it from the gateway's logs")
    domains = list(dict.fromkeys(domain for row in rows for domain in row.get("by_domain", {})))
    for name in ("cycle", "production model", "failure rate, all", *domains, "tasks kept", "groups trained",
                 "gate", "seconds per stage", "cycle s", "outside stages"):
        table.add_column(name)
    for row in rows:
        low, high = row["interval"]
        rate = f"{row['failure_rate']:.1%} ({low:.1%}..{high:.1%}) of {row['requests']}"
        by_domain = [domain_rate(row.get("by_domain", {}).get(domain)) for domain in domains]
        summary = row.get("summary") or {}
        counts = summary.get("stage_counts", {})
        kept = counts.get("curate", {}).get("kept", "")
        trained = sum(v.get("groups_kept", 0) for k, v in counts.items() if k.startswith("train"))
        gate = counts.get("promote", {}).get("reason", "") if summary else "(final serve)"
        stage_seconds = summary.get("stage_seconds", {})
        stages = ", ".join(f"{k} {v:.0f}" for k, v in stage_seconds.items())
        cycle_s = row.get("cycle_seconds", 0.0)
        # The cycle's wall time not spent inside a stage's work: Prefect's task runs and state
        # changes, lake opens, begin/finish and the report. An upper bound on orchestration.
        # Overlapped rounds run two stages at once: their time counts once.
        overhead = cycle_s - summary.get("busy_seconds", sum(stage_seconds.values()))
        table.add_row(*map(cell, (row["cycle"], row["production"], rate, *by_domain, kept,
                                  trained if summary else "", gate[:60], stages, f"{cycle_s:.0f}" if summary else "",
                                  f"{overhead:.0f}s ({overhead / cycle_s:.0%})" if summary and cycle_s else "")))
    # Wide enough for the per-domain rates and per-stage seconds even when stdout is a log
    # file (rich assumes 80).
    console = rich_console(width=max(rich_console().width, 240))
    console.print(table)
    console.print(f"reports: {plain(home / 'reports')}")


def domain_rate(rate: dict | None) -> str:
    """One domain's failures of its requests and the rate's interval: a domain of ~100
    requests (code, json) is known to +/-10 points at a 50% rate, math to +/-2."""
    if not rate:
        return "-"
    low, high = rate["interval"]
    n, failed = rate["requests"], rate["failures"]
    return f"{failed}/{n} = {failed / n:.0%} ({low:.0%}..{high:.0%})"
