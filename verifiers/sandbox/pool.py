"""Warm bubblewrap workers: start them, hand them jobs, replace the ones that die.

A worker is one long-lived `bwrap ... python3 -I -S -c <sandbox_worker.py>` process tree
in its own cgroup (sandbox_cgroup.py). The pool lends a worker to one caller at a time,
so it is safe to use from several threads; each process builds its own pool (sandbox.py).
Workers are started by one dedicated thread because bubblewrap's --die-with-parent
fires when the *thread* that started it exits, and callers' threads (Dask's, a
ThreadPoolExecutor's) come and go. What this does not do: anything with the program
inside a run; that is sandbox_worker.py.
"""

import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from verifiers.sandbox import worker as sandbox_worker
from verifiers.sandbox.cgroup import CgroupParent, WorkerCgroup, open_cgroup_parent

_WORKER_SOURCE = Path(sandbox_worker.__file__).read_text()
_START_TIMEOUT_S = 30.0
# Host-side margin over the run's own timeout: the supervisor inside enforces the
# timeout; this only catches a worker that stopped answering altogether.
_HOST_GRACE_S = 5.0
_MEMORY_OVERHEAD_MB = 128  # zygote + supervisor + bubblewrap, on top of the run's own limits


class WorkerStartError(RuntimeError):
    """bubblewrap or the zygote inside it did not come up."""


class WorkerLost(RuntimeError):
    def __init__(self, detail: str, *, timed_out: bool = False):
        super().__init__(detail)
        self.timed_out = timed_out


@dataclass(frozen=True)
class WorkerSpec:
    """What makes two workers interchangeable: the same bubblewrap and interpreter."""

    bwrap: str
    python: str


def bwrap_command(spec: WorkerSpec) -> list[str]:
    """The bubblewrap command line of one worker.

    The sandbox sees /usr and the interpreter's prefix read-only (its site-packages
    hidden: the harness is pure stdlib), no network, no host /tmp, /etc or project files.
    --cap-add ALL gives capabilities only inside the sandbox's own user namespace, where
    the per-run supervisor needs them to build each run's namespaces; the program itself
    runs with none (sandbox_worker._drop_capabilities).
    """
    prefix = Path(spec.python).resolve().parent.parent
    cmd = [spec.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
           "--uid", "65534", "--gid", "65534", "--die-with-parent", "--new-session",
           "--cap-add", "ALL", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
           "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
           "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    if not str(prefix).startswith("/usr/"):
        cmd += ["--ro-bind", str(prefix), str(prefix)]
    for site in sorted(prefix.glob("lib/python3*/site-packages")):
        cmd += ["--tmpfs", str(site), "--remount-ro", str(site)]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--dir", "/tmp", "--chdir", "/tmp",
            "--remount-ro", "/dev", "--remount-ro", "/",
            spec.python, "-I", "-S", "-c", _WORKER_SOURCE]
    return cmd


class Worker:
    """One warm zygote; not thread-safe (the pool lends it to one caller at a time)."""

    def __init__(self, spec: WorkerSpec, cgroup: WorkerCgroup | None):
        self.cgroup = cgroup
        # The shell joins the cgroups first so bubblewrap and all it forks start inside.
        join = "".join(f"echo $$ > {shlex.quote(p)} && " for p in (cgroup.procs_files() if cgroup else []))
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", join + 'exec "$@"', "sh", *bwrap_command(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            bufsize=0, close_fds=True, start_new_session=True, env={"PATH": "/usr/bin:/bin"})
        try:
            ready = sandbox_worker.read_frame(self.proc.stdout.fileno(), time.monotonic() + _START_TIMEOUT_S)
        except (TimeoutError, ValueError) as exc:
            ready = ({"ready": False, "detail": str(exc)}, b"", b"")
        if ready is None or not ready[0].get("ready"):
            detail = ready[0].get("detail", "") if ready else ""
            self.retire(keep_stderr=True)
            stderr = self.proc.stderr.read().decode(errors="replace").strip()
            self.proc.stderr.close()
            raise WorkerStartError(f"sandbox worker did not start: {detail} {stderr}".strip())
        self.baseline_tasks = cgroup.task_count() if cgroup else 0
        os.set_blocking(self.proc.stdin.fileno(), False)  # job writes honour the deadline

    def run(self, job: dict, source: bytes, stdin: bytes) -> tuple[dict, bytes, bytes]:
        if self.cgroup:
            try:
                self._wait_for_idle_cgroup()
                self.cgroup.set_limit("pids", self.baseline_tasks + job["max_pids"])
                if "memory" in self.cgroup.paths:
                    mb = job["memory_mb"] + 2 * job["work_dir_mb"] + _MEMORY_OVERHEAD_MB
                    self.cgroup.set_limit("memory", mb << 20)
            except OSError as exc:  # e.g. EBUSY lowering a memory limit below current use
                raise WorkerLost(f"could not set the worker's cgroup limits: {exc}") from exc
        deadline = time.monotonic() + job["timeout_s"] + _HOST_GRACE_S
        cap = 2 * job["max_output_bytes"] + (1 << 20)
        try:
            sandbox_worker.send_frame(self.proc.stdin.fileno(), job, source, stdin, deadline=deadline)
            frame = sandbox_worker.read_frame(self.proc.stdout.fileno(), deadline, max_bytes=cap)
        except TimeoutError as exc:
            raise WorkerLost(f"worker stopped answering: {exc}", timed_out=True) from exc
        except (OSError, ValueError) as exc:
            raise WorkerLost(f"worker sent a broken frame: {exc}") from exc
        if frame is None:
            raise WorkerLost(f"worker exited during the run (status {self.proc.poll()})")
        return frame

    def _wait_for_idle_cgroup(self) -> None:
        """Tasks beyond the worker's own mean an earlier run leaked; never run beside them."""
        for _ in range(100):
            if self.cgroup.task_count() <= self.baseline_tasks:
                return
            time.sleep(0.002)
        raise WorkerLost("tasks of an earlier run are still alive in the worker's cgroup")

    def retire(self, keep_stderr: bool = False) -> None:
        """Kill the whole worker tree and remove its cgroup."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.cgroup:
            self.cgroup.remove()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout) + (() if keep_stderr else (self.proc.stderr,)):
            pipe.close()


class SandboxPool:
    """Up to `max_workers` warm workers of one spec, lent to callers one at a time."""

    def __init__(self, spec: WorkerSpec, max_workers: int):
        self.spec, self.max_workers = spec, max_workers
        self.cgroups: CgroupParent = open_cgroup_parent()
        self._idle: list[Worker] = []
        self._count, self._serial, self._closed = 0, 0, False
        self._cond = threading.Condition()
        self._spawn_requests: queue.Queue = queue.Queue()
        threading.Thread(target=self._spawn_loop, name="sandbox-spawner", daemon=True).start()

    def run(self, job: dict, source: bytes, stdin: bytes) -> tuple[dict, bytes, bytes]:
        """Run one job on a warm worker; a worker that dies is replaced.

        A worker lost for any reason but a timeout is retried once on a fresh one: the
        program cannot reach the zygote, so a lost worker was killed from outside (or
        OOM-killed) and the run itself has no effect that a rerun could duplicate.
        """
        for attempt in range(2):
            try:
                worker = self._acquire()
            except RuntimeError as exc:  # no replacement worker could start, or pool closed
                return {"status": "sandbox_error", "exit_code": None, "detail": str(exc)}, b"", b""
            try:
                frame = worker.run(job, source, stdin)
            except WorkerLost as lost:
                self._release(worker, healthy=False)
                if not lost.timed_out and attempt == 0:
                    continue
                status = "timeout" if lost.timed_out else "sandbox_error"
                return {"status": status, "exit_code": None, "detail": f"{lost}; worker replaced"}, b"", b""
            # "fatal": the zygote reported its own failure and exited; start afresh.
            self._release(worker, healthy=not frame[0].get("fatal"))
            return frame
        raise AssertionError("unreachable: the second attempt returns")

    def start_worker(self) -> None:
        """Start one worker now (raises WorkerStartError), e.g. to fail fast or pre-warm."""
        self._release(self._acquire(), healthy=True)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.retire()
        self._spawn_requests.put(None)
        self.cgroups.remove()

    def _acquire(self) -> Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the sandbox pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._count < self.max_workers:
                    self._count += 1
                    self._serial += 1
                    serial = self._serial
                    break
                self._cond.wait()
        try:
            return self._spawn(serial)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, worker: Worker, healthy: bool) -> None:
        with self._cond:
            keep = healthy and not self._closed
            if keep:
                self._idle.append(worker)
            else:
                self._count -= 1
            self._cond.notify()
        if not keep:
            worker.retire()

    def _spawn(self, serial: int) -> Worker:
        box: list = []
        done = threading.Event()
        self._spawn_requests.put((serial, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _spawn_loop(self) -> None:
        while (request := self._spawn_requests.get()) is not None:
            serial, box, done = request
            try:
                box.append(Worker(self.spec, self.cgroups.new_worker(f"w{serial}")))
            except BaseException as exc:  # handed to the waiting caller, who raises it
                box.append(exc)
            finally:
                done.set()
