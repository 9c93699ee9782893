"""Adaptive sampling against fixed G, at an equal count of groups kept, on a real model.

One run samples `--pool` completions of each of N demo tasks (math and code, the
demo's production mix) with a real instruct model through vLLM, and scores them with
the pipeline's verifiers (code in the sandbox). Both ways of sampling are then replayed
on those outcomes: samples are independent given the prompt, so any k of the pool are a
fair draw of k.
  - fixed G (plain GRPO): G samples of every task; a group is kept when its rewards differ;
  - adaptive (tasks/round/routing.py): `first_samples` of every task, the rest of G only
    where `needs_more` says the route is undecided (a mixed first wave; no task has
    history in a first round, which is the least favourable case for adaptive).
Each is measured as rollouts sampled per group kept; at an equal count of groups kept
the saving is 1 - adaptive / fixed. The pool is cut into disjoint windows of G samples
(pool / G estimates), and a bootstrap over tasks gives the interval.

Two workloads from the same samples:
  - all tasks: every demo task drawn;
  - production failures: the tasks a round really samples. Each task is first served
    once as production serves it (temperature 0.3, the demo's TrafficConfig); only the
    tasks that call failed become failure logs, so only they are replayed.
Why the workload decides the figure: stopping after a uniform first wave saves only on
tasks whose pass rate is exactly 0 or 1 (they cost `first_samples` instead of G). On a
task with a small pass rate p > 0, both ways spend ~1/p rollouts per kept group; on one
near p = 0.5 adaptive costs up to ~6% more. The saving is about the share of hopeless
(or solved) tasks times 1 - first/G, and failures are mostly hopeless for a small model.
The replay is also shown for first waves of 2, 3 and 4 (the default is the config's).

    .venv/bin/python bench/routing.py [--model smollm2] [--tasks 48] [--pool 16]
"""

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flows.demo.data.domains import sample_task  # noqa: E402
from flows.demo.simulate import TrafficConfig  # noqa: E402
from tasks.round.routing import History, RoutingConfig, needs_more  # noqa: E402
from tasks.round.scoring import score_rows  # noqa: E402
from trainer.engine import EngineConfig, generate  # noqa: E402
from trainer.model_import import convert, resolve_source  # noqa: E402
from verifiers.registry import DEFAULT_DOMAIN_MAP, VerifierConfig  # noqa: E402
from verifiers.verdict import INFRA_STATUSES  # noqa: E402


def demo_tasks(n: int, seed: int) -> list[dict]:
    """Two math tasks to one code task, distinct prompts."""
    rng, tasks, seen = random.Random(seed), [], set()
    while len(tasks) < n:
        task = sample_task("code" if len(tasks) % 3 == 2 else "math", rng)
        if task["prompt"] not in seen:
            seen.add(task["prompt"])
            tasks.append(task)
    return tasks


def sample_outcomes(model_dir: Path, tasks: list[dict], n: int, temperature: float) -> list[list[bool]]:
    """pass/fail of `n` samples of each task (infra failures left out)."""
    cfg = EngineConfig(n=n, temperature=temperature, max_tokens=96, max_tokens_by_domain={"math": 96, "code": 256},
                       max_model_len=1024, timeout_s=3600.0)
    started = time.perf_counter()
    samples = generate(model_dir, [[{"role": "user", "content": t["prompt"]}] for t in tasks], cfg,
                       [t["domain"] for t in tasks])
    rows = [{"verifier": DEFAULT_DOMAIN_MAP[tasks[s.prompt_idx]["domain"]], "spec": tasks[s.prompt_idx]["reference"],
             "prompt": tasks[s.prompt_idx]["prompt"], "completion": s.text, "id": i} for i, s in enumerate(samples)]
    verdicts = score_rows(rows, VerifierConfig())
    print(f"sampled and scored {len(samples)} completions at temperature {temperature} "
          f"in {time.perf_counter() - started:.0f} s")
    outcomes: list[list[bool]] = [[] for _ in tasks]
    for s, v in zip(samples, verdicts, strict=True):
        if v["status"] not in INFRA_STATUSES:
            outcomes[s.prompt_idx].append(bool(v["passed"]))
    return outcomes


def fixed(window: list[list[bool]], g: int) -> tuple[int, int]:
    """(rollouts, groups kept) of fixed G over one window of samples per task."""
    kept = sum(0 < sum(w[:g]) < len(w[:g]) for w in window)
    return sum(len(w[:g]) for w in window), kept


def adaptive(window: list[list[bool]], g: int, first: int) -> tuple[int, int]:
    rollouts = kept = 0
    for w in window:
        head = w[:first]
        if needs_more(sum(head), len(head), History()):
            rollouts += len(w[:g])
            kept += 0 < sum(w[:g]) < len(w[:g])
        else:
            rollouts += len(head)
    return rollouts, kept


def saving(windows: list[list[list[bool]]], g: int, first: int) -> float:
    fr = sum(fixed(w, g)[0] for w in windows)
    fk = sum(fixed(w, g)[1] for w in windows)
    ar = sum(adaptive(w, g, first)[0] for w in windows)
    ak = sum(adaptive(w, g, first)[1] for w in windows)
    if not fk or not ak:
        return float("nan")
    return 1 - (ar / ak) / (fr / fk)


def report(name: str, outcomes: list[list[bool]], pool: int, g: int, default_first: int, seed: int) -> None:
    windows = [[o[k * g:(k + 1) * g] for o in outcomes] for k in range(pool // g)]
    hopeless = sum(not any(o) for o in outcomes)
    solved = sum(all(o) for o in outcomes if o)
    print(f"\n{name}: {len(outcomes)} tasks, {hopeless} with no pass in {pool} samples, {solved} with every one "
          f"passed; G={g}, {len(windows)} windows of the pool")
    print(f"{'window':>8} {'fixed rollouts':>15} {'kept':>5} {'adaptive rollouts':>18} {'kept':>5} "
          f"{'rollouts/kept fixed':>20} {'adaptive':>9} {'saving':>7}")
    for k, w in enumerate(windows):
        (fr, fk), (ar, ak) = fixed(w, g), adaptive(w, g, default_first)
        print(f"{k:>8} {fr:>15} {fk:>5} {ar:>18} {ak:>5} {fr / max(fk, 1):>20.1f} {ar / max(ak, 1):>9.1f} "
              f"{saving([w], g, default_first):>7.1%}")
    for first in sorted({2, 3, 4, default_first}):
        rng = random.Random(seed)
        boot = sorted(s for s in (saving([[w[i] for i in idx] for w in windows], g, first)
                                  for idx in ([rng.randrange(len(outcomes)) for _ in outcomes] for _ in range(2000)))
                      if s == s)
        mark = " (the default)" if first == default_first else ""
        print(f"first wave {first}{mark}: saving at equal groups kept {saving(windows, g, first):.1%} "
              f"(bootstrap 95% {boot[len(boot) // 40]:.1%}..{boot[-len(boot) // 40 - 1]:.1%} over tasks)")
    print("pass rates per task: " + json.dumps(sorted(round(sum(o) / max(len(o), 1), 2) for o in outcomes)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a HF folder, a .gguf file or a bundled model name")
    parser.add_argument("--tasks", type=int, default=48)
    parser.add_argument("--pool", type=int, default=16)
    parser.add_argument("--group", type=int, default=8, help="G")
    parser.add_argument("--serve-temperature", type=float, default=TrafficConfig.temperature,
                        help="the production call that decides whether a task is a failure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        source = resolve_source(args.model)
        model_dir = source if source.is_dir() else Path(tmp) / "model"
        if not source.is_dir():
            convert(source, model_dir, "float32")
        tasks = demo_tasks(args.tasks, args.seed)
        served = sample_outcomes(model_dir, tasks, 1, args.serve_temperature)
        outcomes = sample_outcomes(model_dir, tasks, args.pool, 0.7)
    print(f"{args.tasks} tasks ({sum(t['domain'] == 'code' for t in tasks)} code), rollouts at temperature 0.7")
    first = RoutingConfig().first_samples
    report("all tasks", outcomes, args.pool, args.group, first, args.seed)
    failed = [o for o, s in zip(outcomes, served, strict=True) if s == [False]]
    report("production failures (the served call failed)", failed, args.pool, args.group, first, args.seed)


if __name__ == "__main__":
    main()
