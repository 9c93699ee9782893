"""GRPO steps on a GPU worker: tokens/s and model FLOPs utilisation of flywheel's trainer.

    python bench/gpu_train.py [--models smollm2-135m,qwen2-0.5b,qwen2-1.5b] [--steps 5]
    python bench/gpu_train.py --models qwen2-1.5b:16384:64,qwen2-1.5b:16384:1   # arms

A model may carry `:MICRO_TOKENS:PAD_MULTIPLE` (GRPOConfig.micro_tokens and
gpu_pad_multiple for that run) to compare settings in one run.

For each architecture, builds a randomly initialised model (no download: only the
config is needed to measure speed) and a synthetic rollouts file of realistic shape
(G samples per prompt, prompts and completions of a few hundred tokens, rewards with
variance in every group), then runs the product's own training path
(`trainer.launch.run_training`: DeepSpeed ZeRO-2, bf16 on GPU, the GRPO loss of
trainer.loss) and reads its per-step metrics. The first step is warm-up and is left
out. MFU counts the FLOPs the step needs, the PaLM convention 6N + 12·L·d·T per trained
token (N the parameters of every matrix product, T the mean sequence length), except
that the output head counts only at completion tokens (the trainer applies it nowhere
else, see trainer/logprobs.py); `mfu_6n` counts it at every token, as the PaLM paper
does. Both are against the H100/H200 datasheet's 989.5 dense bf16 TFLOP/s; `mfu_measured_peak`
is against a bf16 matrix product timed on the same GPU in the same run.

SmolLM2-135M's real weights (98 MB as GGUF) exceed what can be carried to the GPU
worker, so its architecture runs with random weights: speed does not depend on them.
On a CPU machine the script runs the same path with DS_ACCELERATOR=cpu on a tiny
configuration (`--models tiny`), which is how it is checked before a GPU run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.grpo import GRPOConfig  # noqa: E402
from trainer.job import TrainJob, read_metrics, write_job  # noqa: E402
from trainer.launch import run_training  # noqa: E402

DATASHEET_BF16_TFLOPS = 989.5  # H100/H200 SXM dense bf16

ARCHITECTURES = {
    # HuggingFaceTB/SmolLM2-135M-Instruct's config.json
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True)),
    # Qwen/Qwen2-0.5B-Instruct and Qwen2-1.5B-Instruct's config.json
    "qwen2-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                 max_position_embeddings=32768, tie_word_embeddings=True)),
    "qwen2-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                 max_position_embeddings=32768, tie_word_embeddings=True)),
    # for checking the script on a CPU machine
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024,
                           tie_word_embeddings=True)),
}


def build_model(name: str, out: Path, device: str) -> tuple[int, dict]:
    """A random model of `name`'s architecture saved as a Hugging Face folder with a
    stand-in tokenizer (the trainer reads only its pad id); returns the matmul params."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    kind, fields = ARCHITECTURES[name]
    config = AutoConfig.for_model(kind, **fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    model.save_pretrained(str(out))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<pad>": 0, "<unk>": 1}, "<unk>")),
                                        pad_token="<pad>", unk_token="<unk>")
    tokenizer.save_pretrained(str(out))
    embedding = fields["vocab_size"] * fields["hidden_size"]
    total = sum(p.numel() for p in model.parameters())
    # The input embedding is a lookup; the lm_head product is counted once even when tied.
    matmul = total - embedding + (embedding if fields["tie_word_embeddings"] else 0)
    del model
    return matmul, fields


BUILT: dict[str, tuple[int, dict]] = {}


def logprob_check(name: str, device: str, rows: int = 8, length: int = 512) -> dict:
    """The chunked head (trainer/logprobs.py) against the full logits on this device, in
    the trainer's dtype (bf16 on a GPU): logprob differences and the head's gradient."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.logprobs import full_logit_logprobs, token_logprobs

    kind, fields = ARCHITECTURES[name]
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **fields),
                                                 dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    ids = torch.randint(2, fields["vocab_size"], (rows, length), device=device)
    mask = torch.zeros(rows, length - 1, dtype=torch.bool, device=device)
    mask[:, length // 3:] = True
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mask": mask}
    out = {}
    for label, fn in (("chunked", token_logprobs), ("full", full_logit_logprobs)):
        model.zero_grad()
        logp, _ = fn(model, batch, 1.0, with_entropy=False)
        logp.sum().backward()
        out[label] = (logp.detach()[mask].float(), model.lm_head.weight.grad.float())
    diff = (out["chunked"][0] - out["full"][0]).abs()
    grad_diff = (out["chunked"][1] - out["full"][1]).norm() / out["full"][1].norm()
    return {"check": "chunked head vs full logits", "model": name, "dtype": str(next(model.parameters()).dtype),
            "logprob_max_abs_diff": round(float(diff.max()), 5), "logprob_mean_abs_diff": round(float(diff.mean()), 6),
            "head_grad_rel_diff": round(float(grad_diff), 5)}


def write_rollouts(path: Path, prompts: int, group: int, prompt_len: int, completion_len: int, vocab: int,
                   seed: int = 0) -> None:
    """`prompts` groups of `group` samples; completions of 1/2 to 1 x completion_len
    tokens; rewards 0/1 with at least one of each in every group (every group is kept)."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for p in range(prompts):
            prompt = [rng.randrange(2, vocab) for _ in range(prompt_len)]
            for s in range(group):
                n = rng.randint(completion_len // 2, completion_len)
                reward = float(s % 2 == 0) if s < 2 else float(rng.random() < 0.5)
                f.write(json.dumps({"task_id": f"t{p}", "sample_idx": s, "prompt_token_ids": prompt,
                                    "token_ids": [rng.randrange(2, vocab) for _ in range(n)],
                                    "logprobs": [-rng.uniform(0.1, 3.0) for _ in range(n)], "reward": reward,
                                    "status": "ok" if reward else "wrong"}) + "\n")


def matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    """bf16 n x n x n products per second on this GPU (after warm-up), in TFLOP/s."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def bench(arm: str, args, work: Path, device: str, peak_measured: float | None) -> dict:
    name, micro_tokens, pad_multiple = (arm.split(":") + ["", ""])[:3]
    micro_tokens, pad_multiple = int(micro_tokens or args.micro_tokens), int(pad_multiple or args.pad_multiple)
    model_dir, rollouts = work / name / "model", work / name / "rollouts.jsonl"
    t0 = time.perf_counter()
    if name not in BUILT:  # arms of one architecture share its model
        BUILT[name] = build_model(name, model_dir, device)
    matmul_params, fields = BUILT[name]
    write_rollouts(rollouts, args.prompts_per_step * args.steps, args.group, args.prompt_len, args.completion_len,
                   fields["vocab_size"])
    cfg = GRPOConfig(steps=args.steps, groups_per_step=args.prompts_per_step, max_epochs=1.0, zero_stage=2,
                     checkpoint_every=args.steps, max_tokens=args.completion_len, micro_tokens=micro_tokens,
                     gpu_pad_multiple=pad_multiple)
    job_dir = write_job(work / arm.replace(":", "_") / "job", TrainJob(str(model_dir), str(rollouts), cfg,
                                                                        resume="never"))
    t1 = time.perf_counter()
    os.environ["FLYWHEEL_PROFILE_STEP"] = str(args.profile_step)  # read by trainer.ds_train
    run_training(job_dir, n_procs=1, device="auto", timeout_s=args.timeout_s)
    job_s = time.perf_counter() - t1
    if args.profile_step:
        print((job_dir / "profile.txt").read_text(), flush=True)
    steps = read_metrics(job_dir)[1:]  # step 1 warms up kernels and allocator
    shutil.rmtree(job_dir)  # its checkpoints (16 bytes a parameter) filled a 64 GiB disk in three runs
    step_s = sum(s["step_s"] for s in steps) / len(steps)
    tokens_per_s = sum(s["tokens_per_s"] * s["step_s"] for s in steps) / sum(s["step_s"] for s in steps)
    mean_completion = 0.75 * args.completion_len  # write_rollouts draws lengths uniformly in [C/2, C]
    mean_len = args.prompt_len + mean_completion
    head = fields["vocab_size"] * fields["hidden_size"]
    attention = 12 * fields["num_hidden_layers"] * fields["hidden_size"] * mean_len
    flops_6n = 6 * matmul_params + attention
    flops_per_token = 6 * (matmul_params - head) + 6 * head * mean_completion / mean_len + attention
    achieved = tokens_per_s * flops_per_token / 1e12
    row = {"model": name, "micro_tokens": micro_tokens, "gpu_pad_multiple": pad_multiple,
           "matmul_params": matmul_params, "device": device,
           "rows_per_step": args.prompts_per_step * args.group, "tokens_per_step": round(tokens_per_s * step_s),
           "step_s": round(step_s, 3), "tokens_per_s": round(tokens_per_s), "model_tflops": round(achieved, 1),
           "mfu_datasheet": round(achieved / DATASHEET_BF16_TFLOPS, 4),
           "mfu_measured_peak": round(achieved / peak_measured, 4) if peak_measured else None,
           "mfu_6n": round(tokens_per_s * flops_6n / 1e12 / DATASHEET_BF16_TFLOPS, 4),
           "job_s": round(job_s, 1), "build_s": round(t1 - t0, 1), "steps_timed": len(steps)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2-0.5b,qwen2-1.5b")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--completion-len", type=int, default=512)
    parser.add_argument("--micro-tokens", type=int, default=16384)
    parser.add_argument("--pad-multiple", type=int, default=GRPOConfig.gpu_pad_multiple)
    parser.add_argument("--profile-step", type=int, default=0,
                        help="print the torch profiler's table of this step (1-based; 0: none)")
    parser.add_argument("--check-logprobs", default="", metavar="MODEL",
                        help="first compare the chunked head with the full logits on this architecture")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows here as JSON lines")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peak = matmul_tflops() if device == "cuda" else None
    if peak:
        print(json.dumps({"gpu": torch.cuda.get_device_name(), "bf16_matmul_tflops_measured": round(peak, 1),
                          "torch": torch.__version__}), flush=True)
    if args.check_logprobs:
        print(json.dumps(logprob_check(args.check_logprobs, device)), flush=True)
    with tempfile.TemporaryDirectory(prefix="flywheel-gpu-train-") as tmp:
        rows = []
        for arm in args.models.split(","):
            try:
                rows.append(bench(arm, args, Path(tmp), device, peak))
            except Exception as exc:  # one architecture failing must not hide the others' figures
                print(json.dumps({"model": arm, "error": str(exc)[-3000:]}), flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
