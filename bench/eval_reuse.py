"""The evaluate stage with production's earlier evaluation reused vs sampled again, one run.

    python bench/eval_reuse.py HOME [--reps 2]

HOME: a finished `flywheel demo` home (or any lake whose last two cycles each gated a
candidate, the earlier candidate being the later production). Its catalog and data are
copied to a scratch home; HOME is only read. In the copy, the last cycle's candidate
and production are evaluated as its evaluate stage does (the home's flywheel.toml, one
warm engine, the warm Dask cluster), two ways, alternating:
- sampled: `reuse = false`, both models sample every item (every cycle before this change);
- reused: `reuse = true`; production's items of the registered sets come from its
  evaluation in the cycle before, which the bench first reruns (those rows predate the
  settings column) and times as well.
Prints each run's seconds, the items reused, both models' pass@1 and the gate's decision
on each, and the ratio sampled / reused.
"""
from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage.config_file import load_toml  # noqa: E402
from storage.lake import open_lake  # noqa: E402
from storage.settings import LakeSettings  # noqa: E402
from tasks.cycle.config import cycle_config_from  # noqa: E402
from tasks.release.evaluate import EvalConfig, Policy, evaluate_policies  # noqa: E402
from tasks.release.gate import GateConfig, decide  # noqa: E402
from tasks.release.models import local_model_dir  # noqa: E402
from tasks.round.scoring import close_local_cluster  # noqa: E402
from trainer.warm_engine import shared_engine  # noqa: E402


def scratch_copy(home: Path, into: Path) -> Path:
    """The lake of `home` (catalog, data, config) under `into`; models stay where they are."""
    for name in ("catalog.sqlite", "flywheel.toml"):
        shutil.copy2(home / name, into / name)
    shutil.copytree(home / "data", into / "data")
    # DuckLake keeps the data path in its catalog (files are relative to it): point the copy's at its own
    with sqlite3.connect(into / "catalog.sqlite") as catalog:
        catalog.execute("UPDATE ducklake_metadata SET value = ? WHERE key = 'data_path'", [f"{into / 'data'}/"])
    return into


def last_two_gates(con) -> list[tuple[str, str, str]]:
    """(cycle_id, candidate, production) of the last two gated cycles, oldest first."""
    rows = con.execute("SELECT cycle_id, candidate, production FROM lake.gate_decisions "
                       "ORDER BY decided_at DESC LIMIT 2").fetchall()
    if len(rows) < 2 or rows[0][2] != rows[1][1]:
        raise SystemExit("the home needs two gated cycles, the later one's production being the earlier candidate")
    return rows[::-1]


def evaluate(con, settings: LakeSettings, cfg: EvalConfig, cycle_id: str, candidate: str, production: str):
    policies = [Policy(str(local_model_dir(settings, con, candidate)), candidate),
                Policy(str(local_model_dir(settings, con, production)), production, also_check=(candidate,))]
    start = time.perf_counter()
    cand, prod = evaluate_policies(con, policies, cfg, cycle_id)
    seconds = time.perf_counter() - start
    decision = decide(cand.item_scores, prod.item_scores, GateConfig())
    return seconds, cand, prod, decision


def line(label: str, seconds: float, cand, prod, decision) -> str:
    return (f"{label:<9} {seconds:7.1f} s  items reused {cand.reused + prod.reused:4d}  "
            f"candidate pass@1 {cand.headline['pass@1']:.3f}  production {prod.headline['pass@1']:.3f}  "
            f"gate: {'promote' if decision.promoted else 'reject'} ({decision.reason})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("home", type=Path)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flywheel-eval-reuse-") as scratch:
        home = scratch_copy(args.home.resolve(), Path(scratch))
        settings = LakeSettings(home=home)
        cfg = cycle_config_from(load_toml(home / "flywheel.toml").get("cycle", {})).evaluate
        con = open_lake(settings)
        (before, cand0, prod0), (cycle, cand1, prod1) = last_two_gates(con)
        print(f"cycles {before} and {cycle}: G = {cfg.engine.n}, the home's [cycle.evaluate] settings")
        times = {"sampled": [], "reused": []}
        try:
            with shared_engine():
                print(line(f"{before}", *evaluate(con, settings, replace(cfg, reuse=True), before, cand0, prod0)))
                for rep in range(args.reps):
                    order = ("sampled", "reused") if rep % 2 == 0 else ("reused", "sampled")
                    for arm in order:
                        result = evaluate(con, settings, replace(cfg, reuse=arm == "reused"), cycle, cand1, prod1)
                        times[arm].append(result[0])
                        print(line(arm, *result))
        finally:
            con.close()
            close_local_cluster()
    sampled, reused = (sum(t) / len(t) for t in (times["sampled"], times["reused"]))
    print(f"evaluate stage of {cycle}: sampled {sampled:.1f} s, reused {reused:.1f} s, "
          f"ratio {sampled / reused:.2f}x (mean of {args.reps} each)")


if __name__ == "__main__":
    main()
