"""CPU training jobs forked from a warm launcher rather than started cold.

A cold job (`python -m trainer.ds_train`) spends about 8 s on 2 cores importing torch,
DeepSpeed and transformers before its first step; a bench/grpo_peer.py round trains
for 8 s. A `WarmLauncher` keeps one process (`python -m trainer.warm_launch`) that has
done those imports and has run no torch op, and forks it once per job. The fork is the
job: its own process and session (killed with its process group, as a cold job is), its
output in the job's train.log, its title in `ps` the cold command's, its exit code
reported as a subprocess's would be. So a job still cannot take its caller down and
still frees all it allocated when it ends; only the imported modules are shared,
copy-on-write. A job of several ranks forks one process per rank under its first
process, which watches them as the `deepspeed` launcher does: the first rank to fail
has the others killed.

Forked only where that is safe: on CPU (trainer/launch.py decides). The launcher runs no
torch op, so no OpenMP or intra-op thread pool exists to be lost across the fork. GPU
jobs start cold: CUDA state does not survive a fork, and a GPU step dwarfs the imports.

OpenMP reads OMP_NUM_THREADS when it loads, so a launcher serves only jobs whose
environment is the one it started with, up to the variables that name the job's process
group (PER_JOB_KEYS); another environment gets another launcher. Protocol, JSON lines
over the launcher's stdin/stdout: a request {"argv", "env", "log", "model", "ranks"} is
answered {"pid"} once forked and {"exited": pid, "code"} when that job ends. The owner
holds the only write end of the request pipe: closing it, or the owner dying, ends the
launcher once the jobs it runs have ended.
"""
from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

START_TIMEOUT_S = 300.0  # the launcher's imports: ~6 s quiet, minutes on a loaded box
# What names one job's process group; read when the job runs, not when OpenMP loads.
PER_JOB_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
                "CROSS_SIZE")


class ForkedJob:
    """A running job forked by a WarmLauncher, waited on like a `subprocess.Popen`."""

    def __init__(self, launcher: WarmLauncher, pid: int, args: list[str]) -> None:
        self.launcher, self.pid, self.args = launcher, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.launcher.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self.launcher.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = code
        return self.returncode


class WarmLauncher:
    """The launcher process and its owner's side of the pipes; a context manager that
    closes it. Requests are serialised; jobs run side by side."""

    def __init__(self, env: dict[str, str], cwd: str | Path) -> None:
        self.env = dict(env)
        self._log = tempfile.NamedTemporaryFile(prefix="flywheel-launcher-", suffix=".log", delete=False)
        self._proc = subprocess.Popen([sys.executable, "-u", "-m", "trainer.warm_launch"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, env=self.env, cwd=str(cwd),
                                      start_new_session=True, text=True)
        self._lock = threading.Lock()
        self._ended = threading.Condition()
        self._exits: dict[int, int] = {}
        self._forks: queue.Queue[int | None] = queue.Queue()
        self._running: set[int] = set()
        self._gone = False
        threading.Thread(target=self._read_replies, daemon=True, name="warm-launch-replies").start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a job with this environment may be forked from this launcher."""
        return not self._gone and same_environment(self.env, env)

    def start(self, argv: list[str], env: dict[str, str], log: Path, model: str | None = None,
              ranks: int = 1) -> ForkedJob:
        """Fork a job running `trainer.ds_train` with `argv` (its command-line arguments) in
        `ranks` processes; `env` names the process group (WORLD_SIZE...) but not the rank."""
        if not self.serves(env):
            raise ValueError("this launcher was started with another environment, or has ended")
        request = {"argv": argv, "env": env, "log": str(log), "model": model, "ranks": ranks}
        with self._lock:
            try:
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                raise RuntimeError(f"the warm launcher has ended; its log:\n{self.log_tail()}") from None
            try:
                pid = self._forks.get(timeout=START_TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError(f"the warm launcher forked nothing in {START_TIMEOUT_S:.0f}s; "
                                   f"its log:\n{self.log_tail()}") from None
        if pid is None:
            raise RuntimeError(f"the warm launcher ended before forking the job; its log:\n{self.log_tail()}")
        return ForkedJob(self, pid, [sys.executable, "-u", "-m", "trainer.ds_train", *argv])

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The job's exit code (negative: the signal that ended it), or None if it still runs
        after `timeout` seconds. A launcher that ended while the job ran cannot report it:
        the job is killed and that is an error."""
        with self._ended:
            self._ended.wait_for(lambda: pid in self._exits or self._gone, timeout)
            if pid in self._exits:
                return self._exits.pop(pid)
            if not self._gone:
                return None
        kill_group(pid)
        raise RuntimeError(f"the warm launcher ended while job {pid} ran; the job was killed; "
                           f"the launcher's log:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return Path(self._log.name).read_text(errors="replace")[-3000:]

    def _read_replies(self) -> None:
        for line in self._proc.stdout:
            reply = json.loads(line)
            if "pid" in reply:
                with self._ended:  # here, not in start(): the job may end before start() returns
                    self._running.add(reply["pid"])
                self._forks.put(reply["pid"])
            else:
                with self._ended:
                    self._exits[reply["exited"]] = reply["code"]
                    self._running.discard(reply["exited"])
                    self._ended.notify_all()
        with self._ended:
            self._gone = True
            self._ended.notify_all()
        self._forks.put(None)

    def close(self) -> None:
        """End the launcher: at once if idle, else by itself once its running jobs end
        (their waiters still get their exit codes)."""
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        with self._ended:
            if self._running:
                return
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> WarmLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def same_environment(a: dict[str, str], b: dict[str, str]) -> bool:
    def strip(env: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if k not in PER_JOB_KEYS}
    return strip(a) == strip(b)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except ProcessLookupError:
        pass


# ---- the launcher process ----

def preload() -> None:
    """Import what every job imports, running no torch op (no thread pool may exist at fork)."""
    import deepspeed  # noqa: F401
    import transformers

    transformers.AutoModelForCausalLM, transformers.AutoTokenizer  # resolve the lazy modules
    try:
        # deepspeed.initialize imports this under ZeRO to check the optimiser, and its
        # torch.compile decorators import inductor: 2.4 s of every job otherwise. It
        # compiles nothing until called, so no thread or process is started here.
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    except ImportError:  # a DeepSpeed without Muon: nothing to preload
        pass
    import trainer.ds_train  # noqa: F401


def preload_architecture(model: str | None) -> None:
    """Import the modeling module of the job's base model (1-2 s a job otherwise)."""
    if not model:
        return
    try:
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        model_type = json.loads((Path(model) / "config.json").read_text())["model_type"]
        getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    except Exception as e:  # the job itself reports a bad model folder
        print(f"warm launcher: no architecture preloaded for {model}: {e!r}", file=sys.stderr, flush=True)


def run_forked_job(request: dict, channels: tuple[int, int]) -> None:
    """In the fork: become the job (session, output, title, environment), run it, exit."""
    code = 1
    try:
        for fd in channels:
            os.close(fd)  # the owner must see end of file when the launcher, not its jobs, ends
        os.setsid()
        out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        ranks = request.get("ranks", 1)
        set_title(request["argv"] + ([f"({ranks} ranks)"] if ranks > 1 else []))
        os.environ.clear()
        os.environ.update(request["env"])
        code = run_job(request["argv"]) if ranks == 1 else lead_ranks(request["argv"], ranks)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def set_title(argv: list[str]) -> None:
    """The title `ps` shows, a cold job's command. Set before the environment changes:
    setproctitle may move the environment's strings to make room."""
    from setproctitle import setproctitle

    setproctitle(" ".join([sys.executable, "-m", "trainer.ds_train", *argv]))


def run_job(argv: list[str]) -> int:
    """Run trainer.ds_train in this process as its interpreter would; its exit code."""
    code = 1
    try:
        from trainer.ds_train import main

        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    try:
        import atexit

        atexit._run_exitfuncs()  # what a cold job's interpreter runs at its exit
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    return code


def lead_ranks(argv: list[str], ranks: int) -> int:
    """Fork one process per rank and wait, as the `deepspeed` launcher does: the first
    rank to fail has the others killed (a rank left alone waits forever in a collective)
    and gives the job its exit code."""
    alive = {}
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
                rank_argv = [*argv, f"--local_rank={rank}"]
                set_title(rank_argv)
                code = run_job(rank_argv)
            finally:
                os._exit(code)
        alive[pid] = rank
    code = 0
    while alive:
        pid, status = os.wait()
        alive.pop(pid, None)
        exited = os.waitstatus_to_exitcode(status)
        if exited != 0 and code == 0:
            code = exited if exited > 0 else 128 - exited
            print(f"warm launcher: a rank exited with {exited}; killing the other ranks", flush=True)
            for other in alive:
                try:
                    os.kill(other, 9)
                except ProcessLookupError:
                    pass
    return code


def reap(replies: int, block: bool = False) -> bool:
    """Report every job that ended; False once no job is left."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        os.write(replies, (json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n").encode())


def serve() -> None:
    # Private copies of the pipes; fd 1 then points at the log, so nothing a library
    # prints can corrupt a reply, and stdin at /dev/null.
    requests, replies = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    preload()
    pending = b""
    while True:
        reap(replies)
        if not select.select([requests], [], [], 0.05)[0]:
            continue
        chunk = os.read(requests, 65536)
        if not chunk:
            break  # the owner closed the pipe or died
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            preload_architecture(request.get("model"))
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                run_forked_job(request, (requests, replies))
            os.write(replies, (json.dumps({"pid": pid}) + "\n").encode())
    # Still report the jobs that run on: an owner that replaced this launcher waits on them.
    while reap(replies, block=True):
        pass


if __name__ == "__main__":
    serve()
