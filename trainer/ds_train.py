"""Per-process entry point started by the `deepspeed` launcher (or, for one process, by
trainer.launch itself, or forked by trainer/warm_launch.py): `-m trainer.ds_train --job DIR`.

Every rank loads the same job, rollouts and base model, wraps the model in a DeepSpeed
engine (client-side torch AdamW: DeepSpeed's fused Adam would need a C++ build on CPU),
resumes from the job's newest checkpoint when there is one, runs the remaining steps,
and rank 0 writes metrics and finally the Hugging Face folder. On CPU the launcher sets
DS_ACCELERATOR=cpu and ranks talk over gloo; on GPU over NCCL in bf16.
"""

from __future__ import annotations

import argparse
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.grpo import (GRPOConfig, RowScores, append_metrics, deepspeed_config, rows_trained, score_rows,
                          step_metrics, timed, train_step, truncate_metrics)
from trainer.job import (TrainJob, checkpoint_dir, copy_tokenizer_files, drop_superseded_checkpoints, latest_tag,
                         metrics_path, model_dir, read_job)
from trainer.rollout_data import RolloutDataError, group_rollouts, read_rollouts
from trainer.sft import read_sft_rows

SUM_KEYS = ("loss", "kl", "clip_frac", "entropy", "tokens", "all_tokens", "sft_nll", "sft_tokens")


def load_policy(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, pad_token_id(tokenizer)


def pad_token_id(tokenizer) -> int:
    """The id padded positions hold: pad, else eos, else 0. Any id does: a batch masks its
    padding by each row's length (rollout_data.pad_batch), never by value; a tokenizer
    with neither (its chat template ends a turn with a token of its own) must still train."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    return 0


def with_lora(model, cfg):
    """The model with LoRA adapters on cfg.lora_targets (B = 0: it starts as the base)."""
    from peft import LoraConfig, get_peft_model

    alpha = cfg.lora_alpha if cfg.lora_alpha is not None else 2 * cfg.lora_rank
    return get_peft_model(model, LoraConfig(r=cfg.lora_rank, lora_alpha=alpha,
                                            target_modules=list(cfg.lora_targets), lora_dropout=0.0))


def run(job_dir: Path) -> None:
    import deepspeed

    on_gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu"
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job = read_job(job_dir)
    cfg = job.config
    torch.manual_seed(cfg.seed)
    groups = group_rollouts(read_rollouts(job.rollouts), cfg.scale_by_std, cfg.dynamic_sampling)
    sft_rows = read_sft_rows(job.sft_rows)
    if groups.with_signal == 0 and not sft_rows:
        raise RolloutDataError(f"{job.rollouts}: no group has reward variance and the job has no SFT rows; "
                               "nothing to learn from")
    model, pad_id = load_policy(job.base_model)
    if cfg.lora_rank:
        model = with_lora(model, cfg)
    rows_per_step = (cfg.groups_per_step * len(groups.rows) // groups.groups_kept if groups.groups_kept else 0)
    micro = max(1, (rows_per_step + (cfg.sft_per_step if sft_rows else 0)) // world)
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=model, config=deepspeed_config(cfg, micro, world, on_gpu),
        optimizer=torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay))
    steps = cfg.steps_for(groups.groups_kept, len(sft_rows))
    # pi_old is the base policy, scored before any checkpoint is loaded, for the rows this
    # rank trains on in all the job's steps (not only those left): a resumed run scores
    # the same rows in the same pieces, so it uses exactly the values an uninterrupted one did.
    mine = rows_trained(groups, steps, cfg, rank, world)
    old_logp = scatter(score_rows(engine.module, [groups.rows[i] for i in mine], cfg, pad_id, engine.device),
                       mine, len(groups.rows))
    ref_logp = score_reference(job, groups.rows, mine, pad_id, engine.device)
    start = resume(engine, job, job_dir, rank)
    if start == 0:
        carry_optimizer(engine, job, world, rank)
    profile_step = int(os.environ.get("FLYWHEEL_PROFILE_STEP", "0"))  # 1-based; 0: none
    for step in range(start, steps):
        with profiled(step + 1 == profile_step and rank == 0, job_dir / "profile.txt"):
            sums, seconds = timed(train_step, engine, groups, old_logp, ref_logp, step, cfg, rank, world, pad_id,
                                  sft_rows)
        sums = reduce_sums(sums, engine.device)
        if rank == 0:
            append_metrics(metrics_path(job_dir), step_metrics(step, sums, groups, cfg, seconds,
                                                               kl_reference=ref_logp is not None))
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == steps:
            engine.save_checkpoint(str(checkpoint_dir(job_dir)), tag=f"step_{step + 1}",
                                   client_state={"step": step + 1})
            if rank == 0:
                drop_superseded_checkpoints(checkpoint_dir(job_dir))
    export_model(engine, job, job_dir, f"step_{steps}", rank)


@contextmanager
def profiled(enabled: bool, out: Path):
    """With `enabled`, the torch profiler's table of the block's ops (by device time, else
    CPU time) goes to `out`: where a step's time goes, e.g. on a GPU worker."""
    if not enabled:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield
        if cuda:
            torch.cuda.synchronize()
    out.write_text(prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total",
                                             row_limit=30, max_name_column_width=60))


def scatter(scores: list[list[float]], positions: list[int], n: int) -> RowScores:
    """Per-row scores of the rows at `positions`, placed in a list of all `n` rows (None: not scored)."""
    out: RowScores = [None] * n
    for i, s in zip(positions, scores, strict=True):
        out[i] = s
    return out


def score_reference(job: TrainJob, rows: list[dict], mine: list[int], pad_id: int, device) -> RowScores | None:
    if not job.config.kl_coef:
        return None
    ref, _ = load_policy(job.ref_model)
    scores = score_rows(ref.to(device).eval(), [rows[i] for i in mine], job.config, pad_id, device)
    del ref
    return scatter(scores, mine, len(rows))


def resume(engine, job: TrainJob, job_dir: Path, rank: int) -> int:
    """Load the newest checkpoint (weights, optimiser, step) and return the next step."""
    if job.resume == "never":
        return 0
    ckpt = checkpoint_dir(job_dir)
    tag = latest_tag(ckpt, required=job.resume == "must")
    if tag is None:
        return 0
    _, client_state = engine.load_checkpoint(str(ckpt), tag=tag)
    step = int(client_state["step"])
    if rank == 0:
        print(f"flywheel: resuming from checkpoint {tag} (step {step})", flush=True)
        truncate_metrics(metrics_path(job_dir), step)
    return step


def carry_optimizer(engine, job: TrainJob, world: int, rank: int) -> None:
    """Start from the AdamW state of the job that trained the base model (job.optimizer_from).
    Its final checkpoint's weights are the base model's (it was exported from them), so
    loading it whole changes only the optimiser state; learning rate and weight decay stay
    this job's.
    Fresh moments, said in the log, where the state does not fit: no checkpoint there,
    another ZeRO stage, another rank count under ZeRO (it partitions the state by rank),
    or LoRA on either side (the base has the adapters merged)."""
    if not job.optimizer_from:
        return
    ckpt = checkpoint_dir(job.optimizer_from)
    tag = latest_tag(ckpt, required=False)
    why = unfit_optimizer_state(ckpt, tag, job.optimizer_from, job.config, world)
    if why:
        if rank == 0:
            print(f"flywheel: fresh AdamW state ({ckpt}: {why})", flush=True)
        return
    engine.load_checkpoint(str(ckpt), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=False)
    for group in engine.optimizer.param_groups:  # the checkpoint brought the old job's
        group.update(lr=job.config.lr, weight_decay=job.config.weight_decay)
    if rank == 0:
        print(f"flywheel: AdamW state carried from {ckpt / tag}", flush=True)


def unfit_optimizer_state(ckpt: Path, tag: str | None, before_dir: str | Path, config: GRPOConfig,
                          world: int) -> str | None:
    """Why the checkpoint's AdamW state cannot start this job, or None where it fits."""
    if not tag:
        return "no checkpoint"
    before = read_job(before_dir).config
    if before.lora_rank or config.lora_rank:
        return "LoRA"
    if before.zero_stage != config.zero_stage:
        return f"ZeRO stage {before.zero_stage}, this job {config.zero_stage}"
    ranks = len(list((ckpt / tag).glob("*optim_states.pt")))
    if before.zero_stage and ranks != world:
        return f"{ranks} ranks, this job {world}"
    return None


def reduce_sums(sums: dict[str, float], device) -> dict[str, float]:
    # On the rank's device: NCCL cannot reduce CPU tensors.
    t = torch.tensor([sums[k] for k in SUM_KEYS], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(SUM_KEYS, t.cpu().tolist()))


def export_model(engine, job: TrainJob, job_dir: Path, tag: str, rank: int) -> None:
    """Write the policy as a Hugging Face folder; `model/` appears only when complete."""
    dist.barrier()
    if rank != 0:
        return
    out, tmp = model_dir(job_dir), Path(job_dir) / "model.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    if job.config.lora_rank:
        # ZeRO <= 2 leaves every rank the full weights: merge the adapters into them, so
        # the candidate is a plain folder (no adapter files) like any other model.
        engine.module.merge_and_unload().save_pretrained(str(tmp))
    elif job.config.zero_stage == 0 or module_holds_master_weights(engine, job.config):
        engine.module.save_pretrained(str(tmp))
    else:
        # ZeRO keeps the fp32 master weights partitioned in the checkpoint; merge them.
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir(job_dir)), tag=tag)
        model, _ = load_policy(job.base_model)
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
        if set(missing) - tied or unexpected:
            raise RuntimeError(f"checkpoint {tag} does not match the base model: "
                               f"missing {missing}, unexpected {unexpected}")
        model.save_pretrained(str(tmp))
    copy_tokenizer_files(Path(job.base_model), tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def module_holds_master_weights(engine, config: GRPOConfig) -> bool:
    """Whether the engine's module is the optimiser's fp32 weights, bit for bit, as under
    ZeRO-1/2 in fp32 (CPU): every rank keeps the whole model, and DeepSpeed copies the
    updated master partitions into it after each step. Exporting it then skips
    re-reading the checkpoint and loading the base model again (~1.3 s a SmolLM2 job).
    In bf16 (GPU) the module is a rounded copy; ZeRO-3 partitions it."""
    return config.zero_stage < 3 and all(p.dtype == torch.float32 for p in engine.module.parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    # trainer.launch names the port of a rank it starts itself (MASTER_PORT is set from it),
    # so that the job's all-reduce buffers can be found by port once it ends
    parser.add_argument("--master_port", type=int, default=None)
    run(parser.parse_args(argv).job)


if __name__ == "__main__":
    main()
