"""A cycle's vLLM sampling with one warm engine vs a cold worker per call, same seeds.

    python bench/warm_engine.py [--rounds 3] [--waves 2] [--prompts 32] [--n 4]

The calls a cycle makes, on the tiny model: each round samples its policy in `waves`
calls (adaptive sampling's first wave and top-up, seeds s and s+1), the policy then
"trains" (its weights are perturbed, as a GRPO step would move them, into a new
folder), and the evaluation samples the last policy and the first one (candidate and
production) in one call. Cold: each call starts its own worker process and engine, as
before issue #20. Warm: one `trainer.warm_engine.WarmEngine` serves every call, loading
each policy's weights in place. Prints the seconds of each way, their ratio, every
call's start-up (or reload), and how far the warm engine's samples are from the cold
ones on the same weights: the same tokens, and the max absolute logprob difference.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from flows.demo.tiny_model import init_model  # noqa: E402
from trainer.engine import EngineConfig, generate_vllm_each  # noqa: E402
from trainer.warm_engine import WarmEngine  # noqa: E402


def perturb(src: Path, dst: Path, seed: int, scale: float = 0.05) -> Path:
    """A copy of src whose every weight moved by scale x its own spread (a training step)."""
    shutil.copytree(src, dst)
    generator = torch.Generator().manual_seed(seed)
    for path in dst.glob("*.safetensors"):
        tensors = load_file(path)
        save_file({name: (t + scale * t.float().std() * torch.randn(t.shape, generator=generator)).to(t.dtype)
                   for name, t in tensors.items()}, path, metadata={"format": "pt"})
    return dst


def cycle_calls(policies: list[Path], prompts: list, cfg: EngineConfig, waves: int):
    """(runs, cfg) of each call a cycle makes, in order."""
    calls = []
    for round_idx, policy in enumerate(policies[:-1]):
        for wave in range(waves):
            calls.append(([(policy, prompts)], replace(cfg, seed=100 * round_idx + wave)))
    calls.append(([(policies[-1], prompts), (policies[0], prompts)], cfg))  # evaluation
    return calls


def compare(warm, cold) -> tuple[int, int, float]:
    """(samples, samples with other tokens, max |logprob difference| over same-token samples)."""
    pairs = [(w, c) for w_run, c_run in zip(warm, cold, strict=True) for w, c in zip(w_run, c_run, strict=True)]
    same = [(w, c) for w, c in pairs if w.token_ids == c.token_ids]
    worst = max((abs(x - y) for w, c in same for x, y in zip(w.logprobs, c.logprobs, strict=True)), default=0.0)
    return len(pairs), len(pairs) - len(same), worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--waves", type=int, default=2, help="sampling calls per round")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    rng = random.Random(0)
    prompts = [[{"role": "user", "content": f"What is {rng.randint(10, 99)}+{rng.randint(10, 99)}?"}]
               for _ in range(args.prompts)]
    cfg = EngineConfig(n=args.n, max_tokens=args.max_tokens, temperature=1.0, seed=0)
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        policies = [init_model(Path(tmp) / "policy-0")]
        for r in range(1, args.rounds + 1):
            policies.append(perturb(policies[-1], Path(tmp) / f"policy-{r}", seed=r))
        calls = cycle_calls(policies, prompts, cfg, args.waves)
        print(f"{len(calls)} calls ({args.rounds} rounds x {args.waves} waves + evaluation of 2 models), "
              f"{args.prompts} prompts x {args.n} samples each; load average {os.getloadavg()[0]:.1f}")

        t0 = time.perf_counter()
        cold = [generate_vllm_each(runs, c) for runs, c in calls]
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with WarmEngine() as engine:
            warm = [engine.generate_each(runs, c) for runs, c in calls]
        warm_s = time.perf_counter() - t0

    print(f"{'call':>4}  {'cold start s':>12}  {'warm':>9}  {'warm start s':>12}")
    for k, ((_, cold_t), (_, warm_t)) in enumerate(zip(cold, warm)):
        for ct, wt in zip(cold_t, warm_t):
            print(f"{k:>4}  {ct['startup_s']:>12.2f}  {wt['engine']:>9}  {wt['startup_s']:>12.2f}")
    n, differ, worst = compare([s for c in warm for s in c[0]], [s for c in cold for s in c[0]])
    print(f"cold (a worker per call): {cold_s:.1f} s; warm (one engine): {warm_s:.1f} s; "
          f"ratio cold/warm {cold_s / warm_s:.2f}x; load average {os.getloadavg()[0]:.1f}")
    print(f"warm vs cold on the same weights: {differ} of {n} samples with other tokens; "
          f"max |logprob difference| {worst:.2e}")


if __name__ == "__main__":
    main()
