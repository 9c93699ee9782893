"""A warm vLLM engine: one worker process, one engine, across a cycle's generate calls.

A cold call (`trainer.engine.generate_vllm_each`) starts a worker process that builds
an engine and exits: 30-120 s of start-up here for every round's sampling waves and for
the evaluation. A `WarmEngine` keeps one worker (`python -m trainer.vllm_worker
--serve`) and its engine alive; each new policy of the same architecture has its
weights loaded into the running engine (trainer/vllm_worker.py: `reload_in_place`), and
only a change of architecture, tokenizer, dtype, context or memory settings builds a
new engine. A reloaded engine samples what a fresh engine on the same weights samples
(same tokens, logprobs equal to 1e-5: tests/trainer/test_warm_engine.py).

The worker talks over two pipes: a request line names a job file, the answer line says
done or why not; samples travel as files, exactly as for a cold worker. The owner holds
the only write end of the request pipe, so closing the engine, or the owner dying,
ends the worker (end of file) without any signal handling here.

A cycle holds one for its whole flow (`shared_engine`, flows/flywheel.py; the demo holds
one across all its cycles, flows/demo/flow.py): Prefect
tasks pass small values only, so `trainer.engine.generate_each` finds the process's
shared engine rather than taking it as a task argument. `EngineConfig.warm = False`
turns that off for a config's calls. Not here: freeing the engine's memory while
training runs (it holds its KV cache, `cpu_kv_cache_gib` or `gpu_memory_utilization`,
for the whole cycle), serving HTTP (flows/gateway).
"""
from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path

from trainer.engine import (Domains, EngineConfig, Messages, Sample, TemplateArgs, job_request, read_outputs,
                            worker_env)

log = logging.getLogger(__name__)


class WarmEngine:
    """A vLLM worker process kept across calls; a context manager that closes it.

    The process starts on the first request (or `start()`); after a failed request it
    is gone and the next request starts a new one. Calls are serialised.
    """

    def __init__(self) -> None:
        self._tmp: tempfile.TemporaryDirectory | None = None  # jobs and the worker's log
        self._proc: subprocess.Popen | None = None
        self._requests = self._replies = None
        self._lock = threading.Lock()
        self._jobs = count()
        self.last_timings: list[dict] = []  # of the last call, one per run

    def __enter__(self) -> WarmEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs."""
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def start(self) -> int:
        """Start the worker (it builds no engine until a request comes); its pid."""
        if self.pid is None:
            self._stop()
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="flywheel-warm-vllm-")
            request_r, request_w = os.pipe()  # non-inheritable: no other child of ours holds them
            reply_r, reply_w = os.pipe()
            with self._log_path().open("a") as log_file:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "trainer.vllm_worker", "--serve", str(request_r), str(reply_w)],
                    pass_fds=(request_r, reply_w), stdin=subprocess.DEVNULL, stdout=log_file,
                    stderr=subprocess.STDOUT, env=worker_env(None))
            os.close(request_r)
            os.close(reply_w)
            self._requests, self._replies = os.fdopen(request_w, "w"), os.fdopen(reply_r, "r")
        return self._proc.pid

    def generate_each(self, runs: list[tuple[Path, list[Messages]]], cfg: EngineConfig,
                      domains: list[Domains] | None = None,
                      template_args: list[TemplateArgs] | None = None) -> tuple[list[list[Sample]], list[dict]]:
        """As `trainer.engine.generate_vllm_each`, from the warm engine; each timing says
        how its engine came to serve the model (`engine`: started, reloaded, rebuilt, reused)."""
        job = job_request(runs, cfg, domains, template_args)
        with self._lock:
            self.start()
            folder = Path(self._tmp.name) / f"job-{next(self._jobs)}"
            folder.mkdir()
            try:
                (folder / "job.json").write_text(json.dumps(job))
                self._ask({"job": str(folder / "job.json"), "out": str(folder / "out.jsonl")}, cfg.timeout_s)
                samples, timings = read_outputs(folder / "out.jsonl", len(runs))
            finally:
                for f in folder.iterdir():
                    f.unlink()
                folder.rmdir()
        self.last_timings = timings
        for run, timing in zip(job["runs"], timings, strict=True):
            log.info("vLLM %s for %s in %.1f s; %.0f tokens/s", timing["engine"], run["model_dir"],
                     timing["startup_s"], timing["tokens_per_s"])
        return samples, timings

    def _ask(self, request: dict, timeout_s: float) -> None:
        log_start = self._log_path().stat().st_size
        try:
            self._requests.write(json.dumps(request) + "\n")
            self._requests.flush()
            ready, _, _ = select.select([self._replies], [], [], timeout_s)
            line = self._replies.readline() if ready else None
        except BrokenPipeError:
            line = ""
        if line is None:
            self._stop()
            raise RuntimeError(f"warm vLLM worker exceeded {timeout_s}s; log tail:\n{self._log_tail(log_start)}")
        answer = json.loads(line) if line else {"ok": False, "error": "the worker exited"}
        if not answer["ok"]:
            self._stop()
            raise RuntimeError(f"warm vLLM worker failed: {answer['error'][-2000:]}\nlog tail:\n"
                               f"{self._log_tail(log_start)}")

    def _log_path(self) -> Path:
        return Path(self._tmp.name) / "worker.log"

    def _log_tail(self, start: int) -> str:
        with self._log_path().open() as f:
            f.seek(start)
            return f.read()[-3000:]

    def _stop(self) -> None:
        """End the worker: closing its request pipe makes it exit; kill it if it lingers."""
        for pipe in (self._requests, self._replies):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass
        self._requests = self._replies = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Stop the worker and remove its files; the engine can be started again."""
        with self._lock:
            self._stop()
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None


_shared: WarmEngine | None = None


@contextmanager
def shared_engine() -> Iterator[WarmEngine]:
    """One warm engine for every vLLM call of this process (whose config has `warm`)
    until the block ends, even when it ends by an error. Nested blocks share the outer one."""
    global _shared
    if _shared is not None:
        yield _shared
        return
    _shared = WarmEngine()
    try:
        yield _shared
    finally:
        engine, _shared = _shared, None
        engine.close()


def shared() -> WarmEngine | None:
    """The engine a `shared_engine` block holds, if any."""
    return _shared
