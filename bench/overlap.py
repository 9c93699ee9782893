"""Overlapped rounds against the synchronous loop: one lake, two copies, same seeds.

    python bench/overlap.py [--rounds 3] [--logs 1500] [--tasks-per-round 256] [--train-steps 20] [--workdir DIR]
                            [--cold-jobs]

Prepares one FLYWHEEL_HOME as the demo does (the tiny model SFT-warmed to about half
right on additions, the demo's evaluation sets and flywheel.toml), lands demo-data
failure logs, and runs `flywheel cycle` twice, each time in that home restored from a
copy of it (same lake, same seeds): once with
`--max-staleness 0` (the synchronous loop: each round sampled by the policy it trains)
and once with `--max-staleness 1` (round r + 1 sampled by the policy round r trains
from, while round r trains). Prints each arm's wall time for its rounds (first rollout
start to last train end, from `cycle_stages`) and for the whole cycle, their ratio, and
the final candidate's held-out pass@1 on each evaluation set with a 95% interval
(mean over items of each item's pass rate, +/- 1.96 standard errors), so the learning
of the two arms can be compared against the noise of either; and the ceiling of any
overlap, the rounds' time at k = 1 had sampling and training never slowed each other,
from the synchronous arm's own stage times. `--cold-jobs` adds a third
arm: synchronous, with every training job a cold interpreter (`[cycle.train]
warm_launch = false`, the cycle before 2026-12-06) instead of a fork of the warm launcher.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from storage.lake import open_lake  # noqa: E402
from storage.settings import LakeSettings  # noqa: E402
from verifiers.verdict import INFRA_STATUSES_SQL  # noqa: E402

FLYWHEEL = [sys.executable, "-m", "flows.cli.app"]

PREPARE = """
import sys
from pathlib import Path
from flows.demo.flow import DemoConfig, DEMO_TOML, build_production_model, register_eval_sets
from storage.config_file import lake_settings
from storage.lake import open_lake
from tasks.release.models import register_model

home = Path(sys.argv[1])
cfg = DemoConfig()
(home / "flywheel.toml").write_text(DEMO_TOML)
_items, prompts = register_eval_sets(home, cfg)
settings = lake_settings()
con = open_lake(settings)
register_model(con, settings, build_production_model(home, cfg, prompts), "bench: SFT-warmed tiny model")
con.close()
"""


def env_for(home: Path) -> dict:
    return dict(os.environ, FLYWHEEL_HOME=str(home), FLYWHEEL_CONFIG=str(home / "flywheel.toml"), COLUMNS="200")


def flywheel(home: Path, *args: str) -> str:
    done = subprocess.run([*FLYWHEEL, *args], capture_output=True, text=True, env=env_for(home), cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"flywheel {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def prepare(home: Path, logs: int) -> None:
    home.mkdir(parents=True)
    subprocess.run([sys.executable, "-c", PREPARE, str(home)], check=True, env=env_for(home), cwd=ROOT)
    data = home.parent / "logs"
    flywheel(home, "demo-data", "--out", str(data), "--logs", str(logs), "--seed", "3")
    shutil.copytree(data / "landing", home / "landing")


def rounds_seconds(home: Path) -> float:
    """First rollout start to last train end: the rounds' wall time."""
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        return con.execute("""
            SELECT max(epoch(finished_at)) FILTER (WHERE stage = 'train')
                 - min(epoch(finished_at) - seconds) FILTER (WHERE stage = 'rollout')
            FROM lake.cycle_stages""").fetchone()[0]
    finally:
        con.close()


def round_stages(home: Path) -> list[tuple[float, float]]:
    """(rollout + verify seconds, train seconds) of each round, in order."""
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        return con.execute("""
            SELECT sum(seconds) FILTER (WHERE stage IN ('rollout', 'verify')), sum(seconds) FILTER (WHERE stage = 'train')
            FROM lake.cycle_stages WHERE round IS NOT NULL GROUP BY round ORDER BY round""").fetchall()
    finally:
        con.close()


def overlap_ceiling(stages: list[tuple[float, float]], staleness: int = 1) -> float:
    """The rounds' wall time if sampling and training never slowed each other (cores to
    spare), given each round's (sampling, training) seconds: round r is sampled once round
    r - 1 is sampled and its behaviour policy is trained (round r - 1 - staleness), and
    trains once it is sampled and round r - 1 has trained. The best any overlap can do."""
    sampled, trained = [], []
    for r, (sample_s, train_s) in enumerate(stages):
        behaviour_ready = trained[r - 1 - staleness] if r - 1 - staleness >= 0 else 0.0
        sampled.append(max(sampled[-1] if sampled else 0.0, behaviour_ready) + sample_s)
        trained.append(max(sampled[r], trained[-1] if trained else 0.0) + train_s)
    return trained[-1] if trained else 0.0


def held_out(home: Path) -> dict[str, tuple[float, float, int]]:
    """eval_set -> (pass@1, half-width of its 95% interval, items) of the final candidate."""
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        rows = con.execute(f"""
            WITH items AS (
                SELECT e.eval_set, e.item_id, avg(e.passed::DOUBLE) AS p
                FROM lake.evaluations e JOIN lake.gate_decisions g ON e.policy_version = g.candidate
                WHERE e.status NOT IN {INFRA_STATUSES_SQL} AND NOT e.contaminated
                GROUP BY 1, 2)
            SELECT eval_set, avg(p), 1.96 * stddev_samp(p) / sqrt(count(*)), count(*)
            FROM items GROUP BY 1 ORDER BY 1""").fetchall()
        return {name: (mean, half, n) for name, mean, half, n in rows}
    finally:
        con.close()


def quiet_load(below: float = 1.0, wait_s: float = 180.0) -> float:
    """Wait (at most wait_s) until the 1-minute load average is below `below`, so one
    arm's exiting processes do not slow the next; the load average then."""
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] >= below and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def run_arm(home: Path, rounds: int, staleness: int, args, warm_launch: bool = True) -> dict:
    started = time.perf_counter()
    os.environ["FLYWHEEL_CYCLE_TRAIN_WARM_LAUNCH"] = str(warm_launch).lower()
    flywheel(home, "cycle", "--cycle-id", f"staleness-{staleness}", "--rounds", str(rounds),
             "--tasks-per-round", str(args.tasks_per_round), "--max-staleness", str(staleness))
    return {"cycle_s": time.perf_counter() - started, "rounds_s": rounds_seconds(home), "held_out": held_out(home),
            "stages": round_stages(home)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--logs", type=int, default=1500)
    parser.add_argument("--tasks-per-round", type=int, default=256)
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--workdir", help="keep the prepared lake here and reuse it on the next run")
    parser.add_argument("--cold-jobs", action="store_true", help="add a synchronous arm with cold training jobs")
    args = parser.parse_args()
    os.environ["FLYWHEEL_CYCLE_TRAIN_GRPO_STEPS"] = str(args.train_steps)
    with tempfile.TemporaryDirectory(prefix="flywheel-overlap-") as tmp:
        # The lake's catalog holds its data folder's absolute path, so each arm runs in the
        # same folder, restored from a copy of the prepared one (kept in --workdir to reuse).
        work = Path(args.workdir or tmp)
        home, prepared = work / "home", work / "prepared"
        if not prepared.exists():
            t0 = time.perf_counter()
            shutil.rmtree(home, ignore_errors=True)
            prepare(home, args.logs)
            shutil.copytree(home, prepared)
            print(f"prepared in {time.perf_counter() - t0:.0f} s: tiny model, demo evaluation sets, "
                  f"{args.logs} logs", flush=True)
        arms = {}
        plan = [("synchronous (k=0)", 0, True), ("overlapped (k=1)", 1, True)]
        if args.cold_jobs:
            plan.append(("k=0, cold jobs", 0, False))
        for label, staleness, warm in plan:
            shutil.rmtree(home, ignore_errors=True)
            shutil.copytree(prepared, home)
            load = quiet_load()
            arms[label] = run_arm(home, args.rounds, staleness, args, warm)
            print(f"{label}: cycle {arms[label]['cycle_s']:.0f} s, "
                  f"rounds {arms[label]['rounds_s']:.0f} s (load average at start {load:.1f})", flush=True)
    print(f"\n{args.rounds} rounds, {args.tasks_per_round} tasks per round, {args.train_steps} steps per round, "
          f"{os.cpu_count()} cores; ratios: each arm's time over the synchronous arm's")
    print(f"{'':24}" + "".join(f"{label:>22}" for label in arms))
    sync = arms["synchronous (k=0)"]
    for key, name in (("rounds_s", "rounds, s"), ("cycle_s", "whole cycle, s")):
        print(f"{name:24}" + "".join(f"{arm[key]:>13.1f} ({arm[key] / sync[key]:.2f}x)" for arm in arms.values()))
    # Overlap hides rounds 2..R's sampling under the training before them, no more: the
    # ceiling says what that is worth at this run's stage shares, on idle cores.
    stages = sync["stages"]
    ideal, total = overlap_ceiling(stages), sum(a + t for a, t in stages)
    print(f"{'ceiling at k=1':24}{ideal:>13.1f} ({total / ideal:.2f}x faster than the synchronous arm's stages, "
          f"{total:.1f} s: " + ", ".join(f"{a:.1f}+{t:.1f}" for a, t in stages) + " s sampling+training a round)")
    for name in sorted(sync["held_out"]):
        n = sync["held_out"][name][2]
        cells = [arm["held_out"].get(name, (0.0, 0.0, 0)) for arm in arms.values()]
        print(f"{'pass@1 ' + name:24}" + "".join(f"{f'{m:.3f} +/- {h:.3f}':>22}" for m, h, _ in cells)
              + f" ({n} items)")


if __name__ == "__main__":
    main()
