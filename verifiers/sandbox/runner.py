"""Run untrusted Python under bubblewrap: the one entry point is `run_python`.

Model-written code is hostile. Each run gets no network, fresh pid/mount/ipc/uts
namespaces inside a user namespace, a read-only view of /usr and the interpreter's
standard library only (not the project, not site-packages), an empty size-capped tmpfs
work dir, a scrubbed environment, no capabilities, rlimits (address space, CPU, file
size, open files), a pids and memory cgroup, a wall-clock timeout that kills every
process of the run, and a cap on captured output. Runs go to warm sandboxed workers
(sandbox_pool.py, sandbox_worker.py) so a run costs a fork, not an interpreter start.

What `run_python` reports is how the program ended (`ok`, with its exit code and output),
or that the infrastructure stopped it (`timeout`, `sandbox_error`); deciding whether the
output is a correct answer is the verifiers' job. It never raises for anything the
program does; it raises `SandboxUnavailable` when it cannot isolate at all.

Known limits, kept deliberately: no seccomp filter (the kernel's namespace and capability
checks are the boundary, as in bubblewrap's default); the sandbox uid maps to the host
user running us (root here), so the read-only mounts, not file ownership, protect host
files; and runs on one worker share the kernel keyrings of the sandbox's user namespace,
a channel between runs that nothing in a verdict reads.
"""

import atexit
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from verifiers.sandbox import worker as sandbox_worker
from verifiers.sandbox.pool import SandboxPool, WorkerSpec, WorkerStartError

log = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be provided on this machine."""


@dataclass(frozen=True)
class SandboxConfig:
    timeout_s: float = 10.0  # wall clock per run; on expiry every process of the run is killed
    cpu_s: int = 10  # RLIMIT_CPU per process
    memory_mb: int = 512  # RLIMIT_AS per process; the worker's memory cgroup adds the work dir
    max_file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_pids: int = 64  # pids cgroup: processes + threads of one run
    max_output_bytes: int = 1_000_000  # per stream (stdout, stderr); beyond it the run is killed
    work_dir_mb: int = 64  # size of the run's tmpfs work dir (/tmp, also the cwd) and /dev/shm
    # "none" runs a plain subprocess with rlimits only: opt in explicitly, never by default.
    isolation: Literal["bwrap", "none"] = "bwrap"
    bwrap_path: str = "bwrap"  # a name looked up on PATH, or an absolute path
    python_path: str = ""  # interpreter inside the sandbox; "" = this process's, resolved

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        for name in ("cpu_s", "memory_mb", "max_file_mb", "max_open_files", "max_pids",
                     "max_output_bytes", "work_dir_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb={self.memory_mb} is below what the interpreter needs; use >= 64")
        if self.max_open_files < 8:
            raise ValueError(f"max_open_files={self.max_open_files} leaves no room for stdio; use >= 8")
        if self.isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none' (weaker, explicit opt-in), got {self.isolation!r}")
        if not self.bwrap_path:
            raise ValueError("bwrap_path must name the bubblewrap binary, e.g. 'bwrap' or '/usr/bin/bwrap'")
        if self.python_path and not os.path.isabs(self.python_path):
            raise ValueError(f"python_path must be absolute (e.g. /usr/bin/python3.11), got {self.python_path!r}")


@dataclass(frozen=True)
class RunResult:
    status: Literal["ok", "timeout", "sandbox_error"]  # ok = the program ran to an exit (any exit code)
    exit_code: int | None  # negative: killed by that signal; None when it did not exit by itself
    stdout: str
    stderr: str
    output_truncated: bool
    duration_ms: float
    detail: str = ""  # why timeout / sandbox_error, or what the sandbox did to the run


_INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`), set "
                 "SandboxConfig.bwrap_path to its location, or opt into weaker isolation "
                 "explicitly with SandboxConfig(isolation='none')")

_WORKER_SOURCE = Path(sandbox_worker.__file__).read_text()
_pools: dict[WorkerSpec, SandboxPool] = {}
_pools_pid = os.getpid()
_pools_lock = threading.Lock()
_warned_unisolated = False  # the isolation='none' warning is logged once per process


def run_python(source: str, *, stdin: str = "", config: SandboxConfig = SandboxConfig()) -> RunResult:
    """Run `source` as `python3 -I -S -c source` would, isolated per `config`."""
    job = {k: v for k, v in asdict(config).items() if k not in ("isolation", "bwrap_path", "python_path")}
    source_b = source.encode("utf-8", "surrogatepass")
    stdin_b = stdin.encode("utf-8", "surrogatepass")
    if config.isolation == "none":
        return _run_unisolated(job, source_b, stdin_b, _python(config))
    started = time.monotonic()
    pool = _pool_for(config)
    header, out, err = pool.run(job, source_b, stdin_b)
    detail = header.get("detail", "")
    if pool.cgroups.version == "none":
        detail = f"{detail}; " if detail else ""
        detail += (f"no pids cgroup ({pool.cgroups.reason}): a fork bomb is bounded only by "
                   "the timeout, since the sandbox uid maps to root, which RLIMIT_NPROC exempts")
    return RunResult(
        status=header["status"], exit_code=header.get("exit_code"),
        stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
        output_truncated=bool(header.get("truncated")),
        duration_ms=header.get("duration_ms", (time.monotonic() - started) * 1000), detail=detail)


def shutdown() -> None:
    """Stop this process's warm workers (also runs at exit); the next run starts new ones."""
    with _pools_lock:
        pools = list(_pools.values()) if _pools_pid == os.getpid() else []
        _pools.clear()
    for pool in pools:
        pool.close()


atexit.register(shutdown)


def _python(config: SandboxConfig) -> str:
    return config.python_path or os.path.realpath(sys.executable)


def _pool_for(config: SandboxConfig) -> SandboxPool:
    global _pools_pid
    bwrap = shutil.which(config.bwrap_path)
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap not found at {config.bwrap_path!r}: {_INSTALL_HINT}")
    spec = WorkerSpec(bwrap=bwrap, python=_python(config))
    with _pools_lock:
        if _pools_pid != os.getpid():
            # A forked child must not share its parent's workers; it builds its own.
            _pools.clear()
            _pools_pid = os.getpid()
        pool = _pools.get(spec)
        if pool is None:
            pool = SandboxPool(spec, max_workers=max(2, os.cpu_count() or 2))
            try:
                pool.start_worker()
            except WorkerStartError as exc:
                pool.close()
                raise SandboxUnavailable(f"{exc}. To fix: {_INSTALL_HINT}") from exc
            _pools[spec] = pool
    return pool


def _run_unisolated(job: dict, source: bytes, stdin: bytes, python: str) -> RunResult:
    """isolation='none': a fresh interpreter with rlimits and a temp dir, nothing more."""
    global _warned_unisolated
    if not _warned_unisolated:
        _warned_unisolated = True
        log.warning("SANDBOX DISABLED: running untrusted code with isolation='none' (rlimits only; no "
                    "namespaces, network or filesystem isolation). Install bubblewrap for real isolation.")
    stdin_fd = os.memfd_create("stdin")
    os.write(stdin_fd, stdin)
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    src_r, src_w = os.pipe()
    with tempfile.TemporaryDirectory(prefix="flywheel-run-") as work:
        started = time.monotonic()
        proc = subprocess.Popen(
            [python, "-I", "-S", "-c", _WORKER_SOURCE, str(src_r), json.dumps(job)],
            stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(src_r,), cwd=work,
            env={"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8"}, start_new_session=True)
        os.close(src_r)
        os.close(stdin_fd)
        try:
            with os.fdopen(src_w, "wb") as pipe:
                pipe.write(source)
        except BrokenPipeError:
            pass  # the interpreter died before reading its source; its exit status says why
        fds = [proc.stdout.fileno(), proc.stderr.fileno()]
        state = sandbox_worker.collect_output(proc.pid, fds, started + job["timeout_s"], job["max_output_bytes"])
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the program's session; a setsid() escapee survives this mode
        except ProcessLookupError:
            pass
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        proc.stderr.close()
    header = sandbox_worker.classify(job, state, status, usage.ru_utime + usage.ru_stime)
    out, err = state["output"]
    return RunResult(status=header["status"], exit_code=header["exit_code"],
                     stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
                     output_truncated=state["truncated"], duration_ms=(time.monotonic() - started) * 1000,
                     detail="; ".join(filter(None, [header["detail"], "isolation='none': rlimits only"])))
