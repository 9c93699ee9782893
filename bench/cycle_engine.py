"""A whole cycle on SmolLM2 with one warm vLLM engine vs a cold worker per call, same seeds.

    python bench/cycle_engine.py [--logs 300] [--rounds 2] [--tasks-per-round 8] [--eval-items 20]

Prepares one FLYWHEEL_HOME (demo failure logs, the demo's evaluation sets, the
SmolLM2-135M-Instruct GGUF imported as production, the real-model config of
flows/demo/real_model.py sized down), copies it twice, and runs `flywheel cycle` in
each copy: once as the product runs it (`warm = true`, one engine for the rounds and
the evaluation, weights reloaded in place), once with `warm = false` in both engine
sections (a worker process and engine per call, as before issue #20). Same seeds, same
lake, so both must sample the same tokens; prints each arm's wall time, every stage's
seconds (from `cycle_stages`), their ratio, and how many rollouts differ.
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

from flows.demo.real_model import REAL_TOML  # noqa: E402
from storage.lake import open_lake  # noqa: E402
from storage.settings import LakeSettings  # noqa: E402

FLYWHEEL = [sys.executable, "-m", "flows.cli.app"]


def flywheel(home: Path, *args: str, extra_env: dict | None = None) -> str:
    env = dict(os.environ, FLYWHEEL_HOME=str(home), FLYWHEEL_CONFIG=str(home / "flywheel.toml"),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), COLUMNS="200", **(extra_env or {}))
    done = subprocess.run([*FLYWHEEL, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"flywheel {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def cold_config(toml: str) -> str:
    """The same config with every engine section set to start a worker per call."""
    return (toml.replace("[cycle.rollout.engine]\n", "[cycle.rollout.engine]\nwarm = false\n")
                .replace("[cycle.evaluate.engine]\n", "[cycle.evaluate.engine]\nwarm = false\n"))


def prepare(home: Path, args) -> None:
    home.mkdir(parents=True)
    toml = REAL_TOML.replace("tasks_per_round = 32", f"tasks_per_round = {args.tasks_per_round}")
    (home / "flywheel.toml").write_text(toml)
    data = home.parent / "demo"
    flywheel(home, "demo-data", "--out", str(data), "--logs", str(args.logs), "--seed", "1")
    for evalset in sorted((data / "evalsets").glob("*.jsonl")):
        # the first items of each set, as the real-model demo judges a slower model
        evalset.write_text("".join(evalset.read_text().splitlines(keepends=True)[:args.eval_items]))
        flywheel(home, "evalset", "add", evalset.stem, str(evalset))
    flywheel(home, "model", "import", "smollm2", "--production")  # the GGUF `make` installs
    shutil.copytree(data / "landing", home / "landing")


def stage_seconds(home: Path) -> dict[str, float]:
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        rows = con.execute("SELECT stage, sum(seconds) FROM lake.cycle_stages "
                           "GROUP BY stage ORDER BY min(finished_at)").fetchall()
        return {stage: round(float(seconds), 1) for stage, seconds in rows}
    finally:
        con.close()


def rollouts(home: Path) -> dict:
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        return {(task, idx): tokens for task, idx, tokens in
                con.execute("SELECT task_id, sample_idx, token_ids FROM lake.rollouts").fetchall()}
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks-per-round", type=int, default=8)
    parser.add_argument("--eval-items", type=int, default=20, help="items kept of each evaluation set")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flywheel-cycle-engine-") as tmp:
        # The lake's catalog holds its data folder's absolute path, so each arm runs in the
        # same folder, restored from a copy of the prepared one.
        home, prepared = Path(tmp) / "home", Path(tmp) / "prepared"
        prepare(home, args)
        shutil.copytree(home, prepared)
        results = {}
        for arm in ("warm", "cold"):
            shutil.rmtree(home)
            shutil.copytree(prepared, home)
            if arm == "cold":
                (home / "flywheel.toml").write_text(cold_config((home / "flywheel.toml").read_text()))
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            flywheel(home, "cycle", "--cycle-id", "bench", "--rounds", str(args.rounds),
                     "--landing", str(home / "landing"))
            results[arm] = (time.perf_counter() - t0, stage_seconds(home), rollouts(home), load)
            print(f"{arm}: {results[arm][0]:.1f} s (load average at start {load:.1f}); stages {results[arm][1]}",
                  flush=True)
        warm, cold = results["warm"], results["cold"]
        same = sum(warm[2].get(key) == tokens for key, tokens in cold[2].items())
        print(f"cycle wall time: warm {warm[0]:.1f} s, cold {cold[0]:.1f} s, cold/warm {cold[0] / warm[0]:.2f}x")
        for stage in warm[1]:
            if stage in cold[1]:
                print(f"  {stage:<24} warm {warm[1][stage]:>7.1f} s   cold {cold[1][stage]:>7.1f} s")
        print(f"rollouts with the same tokens in both arms: {same} of {len(cold[2])}")


if __name__ == "__main__":
    main()
