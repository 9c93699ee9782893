"""DeepSpeed jobs through the real `deepspeed` launcher, on CPU with gloo."""
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer.grpo import GRPOConfig, step_pieces
from trainer.job import CheckpointError, TrainJob, checkpoint_dir, read_metrics, write_job
from trainer.launch import buffer_port, start_training, sweep_orphaned_buffers, wait_training
from trainer.rollout_data import RolloutDataError, group_rollouts, read_rollouts


def weights(model_dir):
    return load_file(str(model_dir / "model.safetensors"))


def test_malformed_rollouts_fail_before_launch(tmp_path, tiny_model):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "t", "sample_idx": 0, "prompt_token_ids": [1, 2]}) + "\n")
    write_job(tmp_path / "job", TrainJob(base_model=str(tiny_model), rollouts=str(bad)))
    with pytest.raises(RolloutDataError, match=r"row 0: missing column\(s\) \['token_ids', 'logprobs'"):
        start_training(tmp_path / "job")


def test_missing_checkpoint_is_a_clear_error(tmp_path, tiny_model, random_rollouts):
    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(random_rollouts), resume="must"))
    with pytest.raises(CheckpointError, match="no DeepSpeed checkpoint .* resume='must'"):
        start_training(job)
    dangling = write_job(tmp_path / "dangling", TrainJob(str(tiny_model), str(random_rollouts)))
    (dangling / "checkpoints").mkdir()
    (dangling / "checkpoints" / "latest").write_text("step_4")
    with pytest.raises(CheckpointError, match="names checkpoint 'step_4' but .* is missing"):
        start_training(dangling)


def test_the_sweep_spares_buffers_of_a_listening_port_and_any_not_of_a_local_job(tmp_path):
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        live_port = live.getsockname()[1]
        with socket.socket() as gone:  # a port bound once, no longer in use
            gone.bind(("127.0.0.1", 0))
            dead_port = gone.getsockname()[1]
        uid = os.getuid()
        names = {"live": f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{live_port}_0",
                 "dead0": f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{dead_port}_0",
                 "dead1": f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{dead_port}_1",
                 "other user": f"deepspeed_allreduce_buffer_{uid + 1}_127.0.0.1_{dead_port}_0",
                 "other host's store": f"deepspeed_allreduce_buffer_{uid}_10.0.0.5_{dead_port}_0",
                 "unreadable": f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_port_0"}
        for name in names.values():
            (tmp_path / name).write_bytes(b"x")
        swept = sweep_orphaned_buffers(tmp_path)
        assert sorted(p.name for p in swept) == sorted([names["dead0"], names["dead1"]])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [names["live"], names["other user"], names["other host's store"], names["unreadable"]])
    assert [p.name for p in sweep_orphaned_buffers(tmp_path)] == [names["live"]]  # its port closed


@pytest.mark.slow
def test_two_process_run_killed_and_resumed_matches_uninterrupted(tmp_path, tiny_model, random_rollouts):
    # 8 steps x 4 of ~14 kept groups: allow the passes that takes (the default caps at 2)
    cfg = GRPOConfig(steps=8, groups_per_step=4, checkpoint_every=2, lr=1e-3, max_epochs=4.0)
    straight = write_job(tmp_path / "straight", TrainJob(str(tiny_model), str(random_rollouts), cfg))
    killed = write_job(tmp_path / "killed", TrainJob(str(tiny_model), str(random_rollouts), cfg))
    # Both start together: their start-up (imports, process group) overlaps.
    straight_proc = start_training(straight, n_procs=2, device="cpu")
    proc = start_training(killed, n_procs=2, device="cpu")
    deadline = time.monotonic() + 300
    while not any(m["step"] >= 3 for m in read_metrics(killed)):
        assert proc.poll() is None, (killed / "train.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "training never reached step 3"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # launcher and both ranks, mid-run
    proc.wait()
    # nobody released the killed job's buffers: the next job's start sweeps them
    killed_port = int(proc.args[proc.args.index("--master_port") + 1])
    swept: list[Path] = []
    while len([f for f in swept if buffer_port(f) == killed_port]) < 2:  # one a rank
        assert time.monotonic() < deadline, f"the killed job's buffers were not swept: {swept}"
        swept += sweep_orphaned_buffers()
        time.sleep(0.2)
    assert not (killed / "model").exists()
    done_before_kill = max(m["step"] for m in read_metrics(killed))
    assert done_before_kill < cfg.steps

    resumed = wait_training(start_training(killed, n_procs=2, device="cpu"), killed, timeout_s=300)
    reference = wait_training(straight_proc, straight, timeout_s=300)
    # DeepSpeed's per-rank all-reduce buffers (named after the job's port) are gone
    ports = {p.args[p.args.index("--master_port") + 1] for p in (straight_proc, proc)}
    assert not [f for f in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*") if f.name.split("_")[5] in ports]

    log = (killed / "train.log").read_text()
    assert "resuming from checkpoint step_" in log
    # 4 checkpoints were saved by each; only the newest is kept (nothing reads an older one)
    for job in (killed, straight):
        assert [p.name for p in checkpoint_dir(job).iterdir() if p.is_dir()] == ["step_8"]
    assert [m["step"] for m in read_metrics(killed)] == list(range(1, cfg.steps + 1))
    a, b, base = weights(resumed), weights(reference), weights(tiny_model)
    assert all(torch.equal(a[k], b[k]) for k in b), "resumed run ended with different weights"
    assert any(not torch.equal(a[k], base[k]) for k in base), "training did not change the weights"
    assert [m["loss"] for m in read_metrics(killed)] == pytest.approx([m["loss"] for m in read_metrics(straight)])
    row = read_metrics(straight)[0]
    assert set(row) >= {"loss", "reward_mean", "reward_std", "kl", "entropy", "clip_frac", "resp_len_mean",
                        "groups_kept", "groups_dropped", "tokens_per_s"}


def test_a_zero3_job_trains_and_exports(tmp_path, tiny_model, random_rollouts):
    """ZeRO-3 partitions the head's weight, so the trainer takes the full-logit path there
    (trainer/logprobs.py: linear_head); the job must still train and export."""
    cfg = GRPOConfig(steps=2, groups_per_step=4, zero_stage=3, lr=1e-3)
    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(random_rollouts), cfg))
    wait_training(start_training(job, n_procs=1, device="cpu"), job, timeout_s=300)
    steps = read_metrics(job)
    assert [m["step"] for m in steps] == [1, 2] and steps[1]["kl"] > 0  # the policy moved
    before, after = weights(tiny_model), weights(job / "model")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_two_ranks_with_different_piece_counts_stay_in_step(tmp_path, tiny_model, random_rollouts):
    """ZeRO-2 reduces gradients inside backward, so a rank that cut more pieces than the
    other would wait on a collective the other never joins (the SmolLM2 demo's cycle-2
    job died so: gloo "Received data size doesn't match"). Groups of 3 rows over 2 ranks,
    one row a piece: rank 0 makes 2 backward passes a step, rank 1 one, plus a zero pass."""
    rows = [json.loads(line) for line in random_rollouts.read_text().splitlines()]
    odd = tmp_path / "odd.jsonl"
    odd.write_text("".join(json.dumps(r) + "\n" for r in rows if r["sample_idx"] < 3))
    cfg = GRPOConfig(steps=2, groups_per_step=1, micro_tokens=1, lr=1e-3)
    groups = group_rollouts(read_rollouts(odd), cfg.scale_by_std)
    assert [step_pieces(groups, s, cfg, world=2, multiple=1) for s in range(2)] == [[2, 1], [2, 1]]

    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(odd), cfg))
    wait_training(start_training(job, n_procs=2, device="cpu"), job, timeout_s=300)
    assert [m["step"] for m in read_metrics(job)] == [1, 2]
    before, after = weights(tiny_model), weights(job / "model")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_zero2_export_is_the_checkpoints_fp32_weights(tmp_path, tiny_model, random_rollouts):
    """Under ZeRO-2 in fp32 the job exports its engine's module (no re-read of the
    checkpoint): it must be, bit for bit, the master weights the checkpoint merges to."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    cfg = GRPOConfig(steps=2, groups_per_step=4, lr=1e-3)
    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(random_rollouts), cfg))
    wait_training(start_training(job, n_procs=2, device="cpu"), job, timeout_s=300)
    merged = get_fp32_state_dict_from_zero_checkpoint(str(job / "checkpoints"), tag="step_2")
    exported, base = weights(job / "model"), weights(tiny_model)
    assert set(exported) <= set(merged) and "model.embed_tokens.weight" in exported
    assert all(torch.equal(exported[k], merged[k]) for k in exported)
    assert any(not torch.equal(exported[k], base[k]) for k in base), "training did not change the weights"


def adamw_state(job_dir: Path) -> tuple[dict, dict]:
    """The (param group, per-parameter state) of a one-rank job's final checkpoint."""
    ckpt = job_dir / "checkpoints"
    files = list((ckpt / (ckpt / "latest").read_text().strip()).glob("*optim_states.pt"))
    state = torch.load(files[0], weights_only=False)["optimizer_state_dict"]["base_optimizer_state"]
    return state["param_groups"][0], state["state"][0]


def test_a_job_starts_from_the_adamw_state_of_the_job_before(tmp_path, tiny_model, random_rollouts):
    first = write_job(tmp_path / "first", TrainJob(str(tiny_model), str(random_rollouts),
                                                   GRPOConfig(steps=2, groups_per_step=4, lr=1e-3)))
    wait_training(start_training(first, device="cpu"), first, timeout_s=300)
    after = GRPOConfig(steps=1, groups_per_step=4, lr=5e-4, weight_decay=0.01)
    carried = write_job(tmp_path / "carried", TrainJob(str(first / "model"), str(random_rollouts), after,
                                                       optimizer_from=str(first)))
    fresh = write_job(tmp_path / "fresh", TrainJob(str(first / "model"), str(random_rollouts), after,
                                                   optimizer_from=str(tmp_path / "never-trained")))
    for job in (carried, fresh):
        wait_training(start_training(job, device="cpu"), job, timeout_s=300)
    (_, before), (group, state) = adamw_state(first), adamw_state(carried)
    assert "AdamW state carried from" in (carried / "train.log").read_text()
    assert int(state["step"]) == 3, "the carried job's AdamW did not continue the first job's count"
    assert (group["lr"], group["weight_decay"]) == (5e-4, 0.01), "the carried state brought the first job's"
    # the second moment keeps the first job's history: 0.999 of it survives one step
    assert torch.all(state["exp_avg_sq"] >= 0.999 * before["exp_avg_sq"] * (1 - 1e-6))
    assert before["exp_avg_sq"].sum() > 0
    assert "fresh AdamW state" in (fresh / "train.log").read_text()
    assert int(adamw_state(fresh)[1]["step"]) == 1
