"""GRPO against its peer: flywheel's trainer vs TRL's GRPOTrainer, like for like, one run each.

    python bench/grpo_peer.py [--rounds 4] [--seed 0] [--with-vllm] [--sft-model DIR] [--trl-fresh-moments]
                              [--keep-uniform-groups] [--once-each] [--fresh-moments] [--cold-jobs]
                              [--save-start DIR]

One SFT-warmed tiny model (flows/demo, 2-digit additions, as bench/grpo.py makes it) is
saved once; both arms start from that folder:
- flywheel: bench/grpo.py's rounds, i.e. the pipeline's path: G samples for each of the
  round's prompts -> exact-answer reward -> a DeepSpeed GRPO job of `steps` optimiser
  steps (trainer/launch.py, trainer/grpo.py), `rounds` times;
- TRL: one `trl.GRPOTrainer.train()` over the same prompts in the same order, set so
  that it, too, samples a round's prompts at once and then takes `steps` optimiser
  steps on slices of that batch (steps_per_generation = steps).
Then the start model and both final models are evaluated on the same held-out problems
with the same engine and sampling (transformers, temperature 1, G samples, one seed).
Wall time of an arm covers its sampling and training only, not the shared SFT nor the
evaluation; the ratios are flywheel/TRL. On 2 cores at load ~2 the two arms took 133 s
and 108 s and the evaluation about a minute; the 400-step SFT took 8 min at load 3 and
26 min at load 5, so a second seed passes the first run's folder (printed as "start
model") as --sft-model. The start is not the same on every host: the same code and pins
gave held-out pass@1 0.234 after 400 SFT steps on one and 0.060 on another (0.708 after
600), so compare arms within one start, never starts across hosts. Shared cores swing
the times: flywheel samples prompt by prompt, many small ops that slow down most when
other jobs take the cores (300 s a round at load 5-8 against 8 s when quiet), so read the
time ratio with the load it prints.

Settings, flywheel (GRPOConfig defaults, bench flags) -> TRL GRPOConfig:
  G samples a prompt -> num_generations; groups_per_step x G -> per_device_train_batch_size
  (gradient_accumulation_steps 1); rounds x steps -> max_steps; the round's prompts
  (steps x groups_per_step) -> generation_batch_size via steps_per_generation = steps,
  shuffle_dataset=False over rows already drawn per round; lr -> learning_rate with
  lr_scheduler_type "constant" (flywheel has no schedule), optim "adamw_torch",
  weight_decay, grad_clip -> max_grad_norm; loss_agg "dapo" -> loss_type "dapo";
  scale_by_std False (Dr. GRPO advantages) -> scale_rewards "none"; eps_low/eps_high ->
  epsilon/epsilon_high (clip-higher 0.2/0.28); kl_coef 0 -> beta 0; temperature 1 ->
  temperature 1, top_p 1, top_k 0; max_tokens 6 -> max_completion_length 6; the prompts
  as chat messages, templated by the model's own chat template in both; the reward is
  bench/grpo.py's `reward` (exact answer) in both, TRL's through a signature adapter;
  torch threads = the cores, as flywheel's one training process gets (OMP_NUM_THREADS);
  float32 (bf16/fp16 off), gradient_checkpointing off (flywheel has none), no vLLM
  (`use_vllm=False`: on CPU TRL samples with transformers' `generate`, so the flywheel
  arm samples with its transformers engine too; `--with-vllm` adds flywheel with vLLM
  rollouts as a third arm), report_to "none", no checkpoints, an in-memory Dataset.
Not matched, by design of either trainer:
- Dynamic sampling: flywheel drops groups whose G rewards are all equal and fills each
  step with 32 groups that carry signal (up to max_epochs=2 passes over them); TRL keeps
  every group, so a step's zero-advantage samples add no gradient but count in the
  dapo token normaliser.
- The dapo normaliser: flywheel divides by the step's own token count; TRL by the
  sampled batch's tokens / steps_per_generation (the mean over the round's steps).
- TIS (tis_cap 2): flywheel weights tokens by pi_old / pi_sampler; with both samplers in
  float32 transformers the weight is ~1. TRL applies its IS correction only with vLLM.
  `--keep-uniform-groups` adds a flywheel arm with `dynamic_sampling=False`: every group
  in its step once, uniform ones with zero advantage, TRL's schedule; `--once-each` one
  with `max_epochs=1`: uniform groups dropped, every kept group once, so fewer steps.
- Optimiser state: each flywheel round is a DeepSpeed job of its own; as in the cycle
  (`[cycle.train] carry_moments`), each job starts from the AdamW state of the round
  before's (TrainJob.optimizer_from), so the moments run on across rounds as in TRL's
  single run. `--fresh-moments` adds a flywheel arm whose jobs start with fresh moments
  (the cycle before 2026-12-06), `--trl-fresh-moments` a TRL arm whose AdamW state is
  cleared at each round's first step.
- Process start: TRL pays its imports once; each flywheel round is a job of its own,
  forked (as in the cycle, `[cycle.train] warm_launch`) from a launcher that has imported
  torch, DeepSpeed and transformers, which the arm starts, so its first job pays the
  imports as TRL's run does. `--cold-jobs` adds a flywheel arm whose jobs each start a
  cold interpreter (before 2026-12-06): the same weights, ~8 s more a job.
- Steps: both take steps_per_round steps a round (flywheel's metrics.jsonl has a row a
  step); flywheel keeps ~350-410 of a round's 512 groups, so ~1.3 passes fill its steps
  (max_epochs=2 would allow 26), some groups twice.
- Sampling code: the same library and sampling rule, but flywheel's engine samples the
  G samples of one prompt as a batch, prompt after prompt; TRL calls `generate` once on
  the whole round (a real difference in speed, which the wall time includes).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.grpo import grpo_round, mean_ci, per_problem_accuracy, prompt, reward, warm_start  # noqa: E402
from trainer.engine import EngineConfig  # noqa: E402
from trainer.grpo import GRPOConfig  # noqa: E402
from trainer.job import copy_tokenizer_files  # noqa: E402
from trainer.launch import close_warm_launcher  # noqa: E402

MAX_TOKENS = 6  # bench/grpo.py's completion budget: a 3-digit sum and <|im_end|>


def exact_answer(prompts, completions, a, b, **_) -> list[float]:
    """TRL's reward signature around bench/grpo.py's `reward`; a and b are dataset columns."""
    return [reward(x, y, c[0]["content"]) for x, y, c in zip(a, b, completions, strict=True)]


def trl_config(args, out: Path):
    from trl import GRPOConfig as TRLConfig

    fw = GRPOConfig()  # flywheel's defaults, which bench/grpo.py's jobs use
    return TRLConfig(
        output_dir=str(out), seed=args.seed, data_seed=args.seed,
        max_steps=args.rounds * args.steps_per_round,
        per_device_train_batch_size=args.prompts_per_step * args.group, gradient_accumulation_steps=1,
        steps_per_generation=args.steps_per_round, num_generations=args.group, num_iterations=1,
        shuffle_dataset=False,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        weight_decay=fw.weight_decay, max_grad_norm=fw.grad_clip,
        loss_type=fw.loss_agg, scale_rewards="group" if fw.scale_by_std else "none",
        epsilon=fw.eps_low, epsilon_high=fw.eps_high, beta=fw.kl_coef,
        temperature=fw.temperature, top_p=1.0, top_k=0, max_completion_length=MAX_TOKENS,
        use_vllm=False, bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False,
        report_to="none", save_strategy="no", logging_steps=args.steps_per_round, disable_tqdm=True,
    )


def run_trl(start: Path, out: Path, rounds: list[list[tuple[int, int]]], args, fresh_moments: bool = False) -> dict:
    """TRL's arm: one GRPOTrainer run; the trained model saved to `out` with the start's tokenizer.
    fresh_moments: clear AdamW's state at each round's first step (flywheel's `--fresh-moments`)."""
    t0 = time.perf_counter()  # TRL's import counts, as each flywheel job's imports of DeepSpeed do
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    class FreshMoments(TrainerCallback):
        def on_step_begin(self, _args, state, _control, optimizer=None, **_):
            if state.global_step and state.global_step % args.steps_per_round == 0:
                # torch AdamW re-creates step and moments lazily for parameters with no state.
                getattr(optimizer, "optimizer", optimizer).state.clear()

    class TimedTrainer(GRPOTrainer):
        # _generate (tokenise, sample, decode) is what flywheel's "sampling" seconds cover.
        sample_s = 0.0

        def _generate(self, prompts):
            t0 = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                self.sample_s += time.perf_counter() - t0

    rows = [{"prompt": prompt(a, b), "a": a, "b": b} for problems in rounds for a, b in problems]
    trainer = TimedTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(start), dtype=torch.float32),
        reward_funcs=exact_answer, args=trl_config(args, out / "trainer"),
        train_dataset=Dataset.from_list(rows), processing_class=AutoTokenizer.from_pretrained(str(start)))
    trainer.remove_callback(PrinterCallback)
    if fresh_moments:
        trainer.add_callback(FreshMoments())
    trainer.train()
    trainer.model.save_pretrained(str(out / "model"))
    copy_tokenizer_files(start, out / "model")
    wall = time.perf_counter() - t0
    logs = [x for x in trainer.state.log_history if "reward" in x]
    for r, x in enumerate(logs):
        print(f"  round {r}: rollout reward {x['reward']:.3f}, zero-std groups "
              f"{x.get('frac_reward_zero_std', float('nan')):.2f}", flush=True)
    return {"model": out / "model", "wall_s": wall, "sample_s": trainer.sample_s,
            "steps": trainer.state.global_step}


def run_flywheel(start: Path, work: Path, rounds: list[list[tuple[int, int]]], args, engine: str,
                 carry_moments: bool = True, warm: bool = True, **grpo: object) -> dict:
    """flywheel's arm: bench/grpo.py's rounds (rollouts, reward, DeepSpeed GRPO job);
    `grpo`: GRPOConfig fields an A/B arm changes; `carry_moments`: each round's job starts
    from the AdamW state of the round before's (TrainJob.optimizer_from); `warm`: jobs
    forked from a warm launcher, which the arm starts (its first job pays the imports)."""
    arm_args = argparse.Namespace(**{**vars(args), "engine": engine, "procs": 1})
    work.mkdir(parents=True)
    model, figures = start, []
    close_warm_launcher()  # no arm inherits a launcher another arm warmed
    t0 = time.perf_counter()
    for r, problems in enumerate(rounds):
        before = work / f"job_{r - 1}" if carry_moments and r else None
        model, f = grpo_round(model, work, problems, arm_args, r, seed=args.seed, optimizer_from=before, warm=warm,
                              **grpo)
        figures.append(f)
    return {"model": model, "wall_s": time.perf_counter() - t0,
            "sample_s": sum(f["sample_s"] for f in figures), "steps": sum(f["steps"] for f in figures)}


def gain_ratio_interval(before, fw, peer, seed: int, n: int = 2000) -> tuple[float, float]:
    """Percentile bootstrap (over held-out problems, paired) of gain_flywheel / gain_TRL."""
    rng = random.Random(seed)
    k, ratios = len(before), []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        g_fw = sum(fw[i] - before[i] for i in idx)
        g_peer = sum(peer[i] - before[i] for i in idx)
        ratios.append(g_fw / g_peer if g_peer > 0 else math.inf)  # a resample with no TRL gain: unbounded
    ratios.sort()
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def report(before: list[float], arms: dict[str, tuple[dict, list[float]]], args) -> dict:
    b, b_ci = mean_ci(before)
    print(f"\nheld-out pass@1: {len(before)} problems x {args.eval_samples} samples, temperature 1, "
          f"transformers engine; {args.rounds} rounds x {args.steps_per_round} steps x "
          f"{args.prompts_per_step} groups of {args.group}; seed {args.seed}")
    print(f"{'arm':<26}{'pass@1':>16}{'gain (paired)':>20}{'wall s':>9}{'sampling s':>12}{'steps':>7}")
    print(f"{'start (SFT)':<26}{b:>9.3f} +/-{b_ci:.3f}")
    out = {"start": b}
    for name, (fig, after) in arms.items():
        a, a_ci = mean_ci(after)
        g, g_ci = mean_ci([y - x for x, y in zip(before, after)])
        print(f"{name:<26}{a:>9.3f} +/-{a_ci:.3f}{g:>+12.3f} +/-{g_ci:.3f}"
              f"{fig['wall_s']:>9.0f}{fig['sample_s']:>12.0f}{fig['steps']:>7}")
        out[name] = {"pass1": a, "gain": g, "gain_ci": g_ci, "wall_s": fig["wall_s"], "sample_s": fig["sample_s"]}
    (fw, fw_after), (peer, peer_after) = arms["flywheel (transformers)"], arms["TRL GRPOTrainer"]
    g_fw, g_peer = out["flywheel (transformers)"]["gain"], out["TRL GRPOTrainer"]["gain"]
    lo, hi = gain_ratio_interval(before, fw_after, peer_after, args.seed)
    diff, diff_ci = mean_ci([x - y for x, y in zip(fw_after, peer_after)])
    ratio = g_fw / g_peer if g_peer > 0 else math.inf
    print(f"flywheel/TRL: gain ratio {ratio:.2f} (bootstrap 95% {lo:.2f}..{hi:.2f}); final pass@1 "
          f"difference {diff:+.3f} +/- {diff_ci:.3f} (paired); wall time ratio {fw['wall_s'] / peer['wall_s']:.2f} "
          f"({fw['wall_s']:.0f}s / {peer['wall_s']:.0f}s)")
    out.update(gain_ratio=ratio, gain_ratio_95=[lo, hi], final_diff=diff, final_diff_ci=diff_ci,
               time_ratio=fw["wall_s"] / peer["wall_s"])
    for name, (_fig, after) in arms.items():
        if name not in ("flywheel (transformers)", "TRL GRPOTrainer"):
            d, d_ci = mean_ci([x - y for x, y in zip(after, peer_after)])
            print(f"{name} - TRL: final pass@1 {d:+.3f} +/- {d_ci:.3f} (paired)")
            out[name]["minus_trl"] = [d, d_ci]
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-operand", type=int, default=99, help="operands are 10..max-operand")
    p.add_argument("--sft-model", type=Path, default=None, help="skip SFT: start both arms from this folder")
    p.add_argument("--sft-steps", type=int, default=400)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompts-per-step", type=int, default=32)
    p.add_argument("--steps-per-round", type=int, default=16, help="a round samples steps x prompts-per-step prompts")
    p.add_argument("--lr", type=float, default=GRPOConfig.lr)
    p.add_argument("--held-out", type=int, default=100)
    p.add_argument("--eval-samples", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="the rounds' prompts, sampling and trainer seeds")
    p.add_argument("--with-vllm", action="store_true", help="also run flywheel with vLLM rollouts")
    p.add_argument("--trl-fresh-moments", action="store_true",
                   help="also run TRL with AdamW's moments cleared each round (as flywheel's --fresh-moments)")
    p.add_argument("--keep-uniform-groups", action="store_true",
                   help="also run flywheel without dynamic sampling: every group in its step, as TRL trains")
    p.add_argument("--fresh-moments", action="store_true",
                   help="also run flywheel with fresh AdamW moments in each round's job (the cycle before 2026-12-06)")
    p.add_argument("--once-each", action="store_true",
                   help="also run flywheel with max_epochs=1: kept groups only, each once (fewer steps)")
    p.add_argument("--cold-jobs", action="store_true",
                   help="also run flywheel with every job a cold interpreter (the launch before 2026-12-06)")
    p.add_argument("--save-start", type=Path, default=None, help="copy the SFT start model here, for --sft-model")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows in a log file as it happens
    # One process per arm on all cores: TRL's in this process, flywheel's training job as
    # the launcher sets it for one rank; the rollouts of both run in this process.
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    problems = [(a, b) for a in range(10, args.max_operand + 1) for b in range(10, args.max_operand + 1)]
    random.Random(0).shuffle(problems)  # the split bench/grpo.py uses, whatever the seed
    held, train = problems[:args.held_out], problems[args.held_out:]
    draw = random.Random(args.seed)
    rounds = [draw.sample(train, args.steps_per_round * args.prompts_per_step) for _ in range(args.rounds)]
    work = Path(tempfile.mkdtemp(prefix="flywheel-bench-grpo-peer-"))
    data = work / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": prompt(a, b)[0]["content"], "completion": str(a + b)}) + "\n"
                            for a, b in train))
    start = args.sft_model or warm_start(work, data, args)
    if args.save_start and not args.sft_model:
        shutil.copytree(start, args.save_start, dirs_exist_ok=True)
    print(f"start model {start}; {threads} torch threads an arm; load {Path('/proc/loadavg').read_text().strip()}")
    figures = {"flywheel (transformers)": lambda: run_flywheel(start, work / "fw", rounds, args, "transformers"),
               "TRL GRPOTrainer": lambda: run_trl(start, work / "trl", rounds, args)}
    if args.trl_fresh_moments:
        figures["TRL, fresh AdamW a round"] = lambda: run_trl(start, work / "trl-fresh", rounds, args, True)
    if args.keep_uniform_groups:
        figures["flywheel, every group"] = lambda: run_flywheel(start, work / "fw-all", rounds, args, "transformers",
                                                                dynamic_sampling=False)
    if args.fresh_moments:
        figures["flywheel, fresh AdamW"] = lambda: run_flywheel(start, work / "fw-fresh", rounds, args,
                                                                "transformers", carry_moments=False)
    if args.once_each:
        figures["flywheel, kept groups once"] = lambda: run_flywheel(start, work / "fw-once", rounds, args,
                                                                     "transformers", max_epochs=1.0)
    if args.cold_jobs:
        figures["flywheel, cold jobs"] = lambda: run_flywheel(start, work / "fw-cold", rounds, args, "transformers",
                                                              warm=False)
    if args.with_vllm:
        figures["flywheel (vLLM rollouts)"] = lambda: run_flywheel(start, work / "fw-vllm", rounds, args, "vllm")
    arms = {}
    # Odd seeds run the arms in reverse order, so that a drift in the machine's load over
    # the run does not always fall on the same arm.
    for name, run_arm in (list(figures.items()) if args.seed % 2 == 0 else list(figures.items())[::-1]):
        print(f"{name}:", flush=True)
        arms[name] = run_arm()
    eval_cfg = EngineConfig(backend="transformers", n=args.eval_samples, max_tokens=MAX_TOKENS, seed=12345)
    before = per_problem_accuracy(start, held, eval_cfg)
    results = {name: (arms[name], per_problem_accuracy(arms[name]["model"], held, eval_cfg)) for name in figures}
    out = report(before, results, args)
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
