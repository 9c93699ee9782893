"""Start a training job in processes of its own and wait for its model.

The caller's process (a Prefect task, a test) never imports DeepSpeed or joins a
process group: `start_training` checks the job (rollouts parse, a required checkpoint
exists) so bad input fails here with a clear error, then starts the job in its own
process group; `wait_training` returns the exported model folder or raises with the
log tail. How it starts:
- on CPU, by default, forked from the process's warm launcher (trainer/warm_launch.py),
  which has already imported torch, DeepSpeed and transformers: ~8 s less a job on 2
  cores, the same weights; several ranks are forked and watched there as the
  `deepspeed` launcher would;
- otherwise (a GPU, or `warm=False`) cold: `deepspeed --num_gpus N --module
  trainer.ds_train --job DIR`, and a one-process job as its rank directly, with the
  variables the launcher would set (the launcher adds two interpreters that each import
  DeepSpeed, 4-5 s of every job on 2 cores, to spawn a single child).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
from contextlib import suppress
from pathlib import Path

from trainer.job import checkpoint_dir, latest_tag, model_dir, read_job
from trainer.rollout_data import RolloutDataError, group_rollouts, read_rollouts
from trainer.sft import read_sft_rows
from trainer.warm_launch import ForkedJob, WarmLauncher

_launcher: WarmLauncher | None = None  # the process's, started by its first warm job
_launcher_lock = threading.Lock()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_job(job_dir: Path) -> None:
    job = read_job(job_dir)
    groups = group_rollouts(read_rollouts(job.rollouts), job.config.scale_by_std,
                            job.config.dynamic_sampling)
    sft_rows = read_sft_rows(job.sft_rows)
    if groups.with_signal == 0 and not sft_rows:
        total = groups.groups_kept + groups.groups_dropped
        raise RolloutDataError(f"{job.rollouts}: all {total} groups have zero reward variance and the "
                               "job has no SFT rows; nothing to learn from "
                               "(sample more, pick harder tasks, or give unsolved tasks references)")
    if job.resume == "must":
        latest_tag(checkpoint_dir(job_dir), required=True)
    elif job.resume == "auto":
        latest_tag(checkpoint_dir(job_dir), required=False)  # a dangling `latest` is an error


def start_training(job_dir: str | Path, n_procs: int = 1, device: str = "auto",
                   warm: bool = True) -> subprocess.Popen | ForkedJob:
    """Launch the job; device 'cpu' forces the CPU accelerator (gloo), 'auto' picks GPU if any.
    `warm`: fork a CPU job (its ranks) from the warm launcher; false: start it cold."""
    import torch

    job_dir = Path(job_dir).resolve()
    check_job(job_dir)
    sweep_orphaned_buffers()
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_NO_ADVISORY_WARNINGS="1", HF_HUB_OFFLINE="1")
    if on_cpu:
        env["DS_ACCELERATOR"] = "cpu"
        # Each rank gets an equal share of the cores unless the caller chose: more OpenMP
        # threads than free cores make torch ops spin and run ~40x slower.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n_procs)))
    # The package root on the path, so `-m trainer.ds_train` resolves in every rank.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    port = str(free_port())
    argv = ["--job", str(job_dir), "--master_port", port]
    forked = warm and on_cpu
    if forked or n_procs == 1:
        # What deepspeed.launcher.launch sets for the job's local ranks (device visibility
        # aside); forked ranks get their own RANK and LOCAL_RANK in the fork
        # (trainer/warm_launch.py: lead_ranks).
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(n_procs), LOCAL_SIZE=str(n_procs),
                   CROSS_RANK="0", CROSS_SIZE="1")
        if n_procs == 1:
            env.update(RANK="0", LOCAL_RANK="0")
    if forked:
        return warm_launcher(env, root).start(argv, env, job_dir / "train.log", read_job(job_dir).base_model,
                                              ranks=n_procs)
    if n_procs == 1:
        cmd = [sys.executable, "-u", "-m", "trainer.ds_train", *argv]
    else:
        launcher = Path(sys.executable).parent / "deepspeed"
        cmd = [str(launcher), "--num_gpus", str(n_procs), "--master_port", port,
               "--module", "trainer.ds_train", "--job", str(job_dir)]
    log = (job_dir / "train.log").open("a")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                            start_new_session=True)


def warm_launcher(env: dict[str, str], root: str) -> WarmLauncher:
    """The process's launcher for jobs with this environment (a new one for another)."""
    global _launcher
    with _launcher_lock:
        if _launcher is None or not _launcher.serves(env):
            if _launcher is not None:
                _launcher.close()
            _launcher = WarmLauncher(env, root)
        return _launcher


@atexit.register
def close_warm_launcher() -> None:
    global _launcher
    with _launcher_lock:
        if _launcher is not None:
            _launcher.close()
            _launcher = None


def wait_training(proc: subprocess.Popen | ForkedJob, job_dir: str | Path, timeout_s: float | None = None) -> Path:
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise RuntimeError(f"training job {job_dir} exceeded {timeout_s}s and was killed") from None
    finally:
        release_shared_memory(proc)
    out = model_dir(job_dir)
    if code != 0 or not out.is_dir():
        tail = (Path(job_dir) / "train.log").read_text()[-4000:]
        raise RuntimeError(f"training job {job_dir} failed (exit {code}); log tail:\n{tail}")
    return out


def sweep_orphaned_buffers(shm: Path = Path("/dev/shm")) -> list[Path]:
    """Unlink the DeepSpeed all-reduce buffers of jobs that no longer run; returns them.

    `release_shared_memory` frees a job's buffers when its caller waits on it. A job
    killed together with its caller (a cycle killed mid-train, the flow's process killed
    for memory) leaves them behind: 66 MB a rank until reboot. A buffer is named after its
    job's master port, where rank 0 holds the process group's store open from before the
    buffer exists until the job ends, so a buffer whose port nobody listens on is garbage.
    (A later job that happens to reuse the port only delays the sweep.) Only this uid's
    buffers of jobs whose store is on 127.0.0.1 are judged: another machine's store
    listens elsewhere.
    """
    listening = listening_ports()
    # our uid's, of jobs whose store is on this machine (the jobs start_training starts)
    local = sorted(shm.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_*"))
    orphans = [path for path in local if (port := buffer_port(path)) is not None and port not in listening]
    for path in orphans:
        path.unlink(missing_ok=True)
    return orphans


def buffer_port(path: Path) -> int | None:
    """The master port in a buffer's name, deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>
    (DeepSpeed's csrc/cpu/comm/shm.cpp); None for a name not of that form."""
    _, port, rank = path.name.rsplit("_", 2)
    return int(port) if port.isdigit() and rank.isdigit() else None


def listening_ports() -> set[int]:
    """TCP ports with a listening socket in this network namespace (/proc/net/tcp, tcp6)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def release_shared_memory(proc: subprocess.Popen | ForkedJob) -> None:
    """Unlink the ended job's DeepSpeed all-reduce buffers; call it after killing a job.

    On CPU, DeepSpeed's shared-memory all-reduce gives each rank a 66 MB buffer in
    /dev/shm, named after the master port, and never unlinks it: every job kept that
    much RAM until reboot (200 jobs held 13 GB of a 24 GB machine here).
    """
    port = proc.args[proc.args.index("--master_port") + 1]
    for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"):
        path.unlink(missing_ok=True)


def run_training(job_dir: str | Path, n_procs: int = 1, device: str = "auto",
                 timeout_s: float | None = None, warm: bool = True) -> Path:
    """Run a job to completion; returns the trained model's Hugging Face folder."""
    return wait_training(start_training(job_dir, n_procs, device, warm), job_dir, timeout_s)
