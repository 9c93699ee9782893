"""A training job started cold against the same job forked from the warm launcher.

    python bench/launch.py [--model tiny|smollm2] [--ranks 1] [--jobs 3] [--steps 4]

The job: 16 addition prompts x 4 samples from the model itself (transformers engine),
rewarded at random so that every group trains (what it learns is beside the point),
GRPO on CPU (ZeRO-2, the default). The same job (model, rollouts, config, seed) runs
`--jobs` times each way, alternately: cold (`trainer.launch.run_training(warm=False)`:
one rank as its own interpreter, several under the `deepspeed` launcher) and warm
(forked from the launcher, trainer/warm_launch.py). The first warm job, which starts
the launcher, is run before them and reported apart. Prints each job's wall seconds and
its optimiser steps' seconds, the medians and their ratio, and whether every job ended
with the same weights. `--model smollm2` converts SmolLM2-135M-Instruct from the GGUF
`make` installs (~25 s).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from bench.grpo import prompt  # noqa: E402
from trainer.engine import EngineConfig, generate  # noqa: E402
from trainer.grpo import GRPOConfig  # noqa: E402
from trainer.job import TrainJob, read_metrics, write_job  # noqa: E402
from trainer.launch import run_training  # noqa: E402

MAX_TOKENS = 32


def build_model(name: str, work: Path) -> Path:
    if name == "tiny":
        from flows.demo.tiny_model import init_model

        return init_model(work / "model")
    from trainer.model_import import convert, resolve_source

    convert(resolve_source("smollm2"), work / "model", "float32")
    return work / "model"


def random_rollouts(model: Path, path: Path) -> Path:
    rng = random.Random(0)
    problems = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(16)]
    samples = generate(model, [prompt(a, b) for a, b in problems],
                       EngineConfig(backend="transformers", n=4, max_tokens=MAX_TOKENS, seed=0))
    with path.open("w") as f:
        for s in samples:
            a, b = problems[s.prompt_idx]
            reward = float(rng.random() < 0.5)
            f.write(json.dumps({"task_id": f"add-{a}-{b}", "sample_idx": s.sample_idx,
                                "prompt_token_ids": s.prompt_token_ids, "token_ids": s.token_ids,
                                "logprobs": s.logprobs, "reward": reward,
                                "status": "ok" if reward else "wrong"}) + "\n")
    return path


def run_job(job: Path, ranks: int, warm: bool) -> tuple[float, float]:
    """(wall seconds, optimiser steps' seconds) of one job to its exported model."""
    started = time.perf_counter()
    run_training(job, n_procs=ranks, device="cpu", timeout_s=1800, warm=warm)
    return time.perf_counter() - started, sum(m["step_s"] for m in read_metrics(job))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--jobs", type=int, default=3, help="jobs each way, after the warm-up job")
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flywheel-bench-launch-"))
    model = build_model(args.model, work)
    rollouts = random_rollouts(model, work / "rollouts.jsonl")
    cfg = GRPOConfig(steps=args.steps, groups_per_step=4, lr=1e-5, max_tokens=MAX_TOKENS, max_epochs=float(args.steps))
    runs: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    jobs = []

    def one(name: str, warm: bool) -> tuple[float, float]:
        job = write_job(work / f"job_{len(jobs)}", TrainJob(str(model), str(rollouts), cfg))
        jobs.append(job)
        wall, steps = run_job(job, args.ranks, warm)
        print(f"  {name:<28}{wall:>8.1f} s  (steps {steps:.1f} s)", flush=True)
        return wall, steps

    print(f"{args.model}, {args.ranks} rank(s), {args.steps} steps a job, "
          f"load {Path('/proc/loadavg').read_text().split()[0]}", flush=True)
    first = one("warm, starts the launcher", True)
    for _ in range(args.jobs):
        runs["cold"].append(one("cold", False))
        runs["warm"].append(one("warm", True))
    med = {name: statistics.median(w for w, _ in r) for name, r in runs.items()}
    base = load_file(str(jobs[0] / "model" / "model.safetensors"))
    same = all(all(torch.equal(base[k], t) for k, t in load_file(str(j / "model" / "model.safetensors")).items())
               for j in jobs[1:])
    print(f"\nmedian job: cold {med['cold']:.1f} s, warm {med['warm']:.1f} s, cold/warm {med['cold'] / med['warm']:.2f}x "
          f"(first warm job, with the launcher's start: {first[0]:.1f} s); "
          f"steps alone cold {statistics.median(s for _, s in runs['cold']):.1f} s, "
          f"warm {statistics.median(s for _, s in runs['warm']):.1f} s")
    print(f"every job ended with the same weights: {same}")
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
