"""One-process CPU jobs forked from the warm launcher: the same job as a cold start, its
own process, its failures and kills reported, the launcher bound to its owner."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from trainer import launch
from trainer.grpo import GRPOConfig
from trainer.job import TrainJob, read_metrics, write_job
from trainer.launch import release_shared_memory, run_training, start_training, wait_training
from trainer.warm_launch import ForkedJob

ROOT = str(Path(__file__).resolve().parents[2])
CFG = GRPOConfig(steps=3, groups_per_step=4, lr=1e-3, checkpoint_every=1)


def weights(model_dir: Path) -> dict:
    return load_file(str(model_dir / "model.safetensors"))


def gone(pid: int, timeout_s: float = 30) -> bool:
    """Exited within timeout_s (a zombie waiting for its new parent counts as exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def ranks_of(leader: int, n: int) -> list[psutil.Process]:
    """The job's n rank processes, once its first process has forked them all."""
    deadline = time.monotonic() + 60
    while len(ranks := psutil.Process(leader).children()) < n:
        assert time.monotonic() < deadline, f"job {leader} forked {len(ranks)} of {n} ranks"
        time.sleep(0.05)
    return ranks


def rank_titles(leader: int, n: int) -> list[str]:
    """The last word of each rank's process title, once every rank has named itself (a
    forked rank shows its leader's title until its first lines run)."""
    deadline = time.monotonic() + 60
    while True:
        titles = sorted(" ".join(rank.cmdline()).rsplit(" ", 1)[-1] for rank in ranks_of(leader, n))
        if all(t.startswith("--local_rank=") for t in titles) or time.monotonic() > deadline:
            return titles
        time.sleep(0.05)


def test_a_forked_job_trains_exactly_as_a_cold_one(tmp_path, tiny_model, random_rollouts):
    jobs = {name: write_job(tmp_path / name, TrainJob(str(tiny_model), str(random_rollouts), CFG))
            for name in ("cold", "warm", "again")}
    run_training(jobs["cold"], device="cpu", timeout_s=300, warm=False)
    forked = start_training(jobs["warm"], device="cpu")
    assert isinstance(forked, ForkedJob) and forked.pid != launch._launcher.pid
    wait_training(forked, jobs["warm"], timeout_s=300)
    launcher = launch._launcher.pid
    run_training(jobs["again"], device="cpu", timeout_s=300)
    assert launch._launcher.pid == launcher, "the second job did not reuse the launcher"

    losses = {name: [m["loss"] for m in read_metrics(job)] for name, job in jobs.items()}
    assert len(losses["cold"]) == CFG.steps and losses["warm"] == losses["cold"] == losses["again"]
    cold, warm = weights(jobs["cold"] / "model"), weights(jobs["warm"] / "model")
    assert all(torch.equal(cold[k], warm[k]) for k in cold), "the forked job ended with other weights"
    assert any(not torch.equal(cold[k], v) for k, v in weights(tiny_model).items()), "nothing trained"


def test_two_forked_ranks_train_exactly_as_under_the_deepspeed_launcher(tmp_path, tiny_model, random_rollouts):
    jobs = {name: write_job(tmp_path / name, TrainJob(str(tiny_model), str(random_rollouts), CFG))
            for name in ("cold", "warm")}
    run_training(jobs["cold"], n_procs=2, device="cpu", timeout_s=300, warm=False)
    forked = start_training(jobs["warm"], n_procs=2, device="cpu")
    assert isinstance(forked, ForkedJob)
    assert rank_titles(forked.pid, 2) == ["--local_rank=0", "--local_rank=1"]
    wait_training(forked, jobs["warm"], timeout_s=300)
    assert [m["loss"] for m in read_metrics(jobs["warm"])] == [m["loss"] for m in read_metrics(jobs["cold"])]
    cold, warm = weights(jobs["cold"] / "model"), weights(jobs["warm"] / "model")
    assert all(torch.equal(cold[k], warm[k]) for k in cold), "the forked ranks ended with other weights"


def test_a_rank_that_dies_has_the_other_killed(tmp_path, tiny_model, random_rollouts):
    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(random_rollouts),
                                               GRPOConfig(steps=40, groups_per_step=4, lr=1e-3, max_epochs=20.0)))
    proc = start_training(job, n_procs=2, device="cpu")
    deadline = time.monotonic() + 300
    while not read_metrics(job):
        assert proc.poll() is None, (job / "train.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the job never finished a step"
        time.sleep(0.05)
    first, second = ranks_of(proc.pid, 2)
    first.kill()  # rank 1 alone would wait forever in its next all-reduce
    assert proc.wait(timeout=60) == 128 + signal.SIGKILL
    release_shared_memory(proc)
    assert gone(second.pid) and not (job / "model").exists()
    assert "a rank exited with -9; killing the other ranks" in (job / "train.log").read_text()


def test_a_failing_job_reports_its_exit_and_log_and_the_launcher_serves_the_next(tmp_path, tiny_model,
                                                                                 random_rollouts):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    bad = write_job(tmp_path / "bad", TrainJob(str(broken), str(random_rollouts), CFG))
    with pytest.raises(RuntimeError, match=r"failed \(exit 1\); log tail:\n(.|\n)*Error"):
        run_training(bad, device="cpu", timeout_s=300)
    launcher = launch._launcher.pid
    good = write_job(tmp_path / "good", TrainJob(str(tiny_model), str(random_rollouts), CFG))
    assert run_training(good, device="cpu", timeout_s=300).is_dir()
    assert launch._launcher.pid == launcher


def test_a_job_killed_mid_run_publishes_nothing(tmp_path, tiny_model, random_rollouts):
    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(random_rollouts),
                                               GRPOConfig(steps=40, groups_per_step=4, lr=1e-3, max_epochs=20.0)))
    proc = start_training(job, device="cpu")
    deadline = time.monotonic() + 300
    while not read_metrics(job):
        assert proc.poll() is None, (job / "train.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the job never finished a step"
        time.sleep(0.05)
    title = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert f"-m trainer.ds_train --job {job}" in title, title  # `ps` names the job, as for a cold one
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    release_shared_memory(proc)  # what wait_training does for a job it waits on
    assert not (job / "model").exists()
    with pytest.raises(RuntimeError, match="exceeded 0.5s and was killed"):
        run_training(job, device="cpu", timeout_s=0.5)  # the timeout path kills the fork too


def test_another_environment_gets_another_launcher_and_the_idle_one_ends(tmp_path, tiny_model, random_rollouts,
                                                                         monkeypatch):
    first = write_job(tmp_path / "first", TrainJob(str(tiny_model), str(random_rollouts), CFG))
    run_training(first, device="cpu", timeout_s=300)
    before = launch._launcher.pid
    monkeypatch.setenv("FLYWHEEL_TEST_MARK", "another")
    second = write_job(tmp_path / "second", TrainJob(str(tiny_model), str(random_rollouts), CFG))
    run_training(second, device="cpu", timeout_s=300)
    assert launch._launcher.pid != before and gone(before)
    launch.close_warm_launcher()
    assert launch._launcher is None


def test_the_launcher_ends_with_its_owner():
    owner = subprocess.Popen(
        [sys.executable, "-c", "import os, time\nfrom trainer.warm_launch import WarmLauncher\n"
         "print(WarmLauncher(dict(os.environ), '.').pid, flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, DS_ACCELERATOR="cpu"))
    try:
        pid = int(owner.stdout.readline())
        assert not gone(pid, timeout_s=0.5)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert gone(pid, timeout_s=120), f"the launcher {pid} outlived its owner"
    finally:
        owner.kill()
        owner.wait()


def test_a_request_from_another_environment_is_refused(tmp_path):
    from trainer.warm_launch import WarmLauncher

    with WarmLauncher(dict(os.environ, PYTHONPATH=ROOT, DS_ACCELERATOR="cpu"), ROOT) as launcher:
        assert launcher.serves(dict(os.environ, PYTHONPATH=ROOT, DS_ACCELERATOR="cpu", MASTER_PORT="1234"))
        with pytest.raises(ValueError, match="another environment"):
            launcher.start(["--job", str(tmp_path)], dict(os.environ, OMP_NUM_THREADS="7"), tmp_path / "log")
