"""Candidate clean tasks for `flywheel demo-data`, drawn in numbered batches.

Batch `i` comes from its own `random.Random` stream, so its content does not depend on
who computes it: large runs draw batches in worker processes while the parent admits
them in order through the guard, and the output is byte-identical to a serial run.
Drawing tasks is most of the generator's time; admission must stay sequential (each
admitted prompt changes what the next may be), so only drawing is spread out.
"""
from __future__ import annotations

import multiprocessing
import os
import random
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING

from flows.demo.data.domains import sample_domain, sample_task
from flows.demo.data.similarity import words

from flows.demo.data.guard import EvalIndex, Fingerprints, fingerprint

if TYPE_CHECKING:
    from flows.demo.data.guard import Guard

BATCH = 1024
PARALLEL_FROM_LOGS = 20_000  # below this, starting worker interpreters costs more than it saves


def sample_batch(seed: int, index: int, eval_index: EvalIndex, size: int = BATCH) -> tuple[list[dict], Fingerprints]:
    """Batch `index` of candidate tasks for `seed`, with their fingerprints."""
    rng = random.Random(f"flywheel-demo:{seed}:tasks:{index}")
    tasks = [sample_task(sample_domain(rng), rng) for _ in range(size)]
    return tasks, fingerprint([words(task["prompt"]) for task in tasks], eval_index)


def worker_count(logs: int, requested: int) -> int:
    """Processes drawing batches: `requested` if set, else all cores but one for large runs.

    Workers are forked, which needs a POSIX system and a parent without other Python
    threads (a forked child could inherit a lock another thread held); otherwise the
    run stays in-process. Forking rather than spawning means no re-import of the
    caller's `__main__`, so scripts without a main guard still work.
    """
    if os.name != "posix" or threading.active_count() > 1:
        return 0
    if requested:
        return requested
    return 0 if logs < PARALLEL_FROM_LOGS else max(1, min(4, (os.cpu_count() or 1) - 1))


class Candidates:
    """Clean tasks the guard admits, in a fixed order whatever the number of workers."""

    def __init__(self, seed: int, guard: Guard, workers: int = 0) -> None:
        self.seed, self.guard, self.index, self.buffer = seed, guard, 0, []
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) if workers else None
        self.ahead: deque[Future] = deque()
        self.depth = 2 * workers

    def __enter__(self) -> Candidates:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _next_batch(self) -> tuple[list[dict], Fingerprints]:
        if not self.pool:
            self.index += 1
            return sample_batch(self.seed, self.index - 1, self.guard.index)
        while len(self.ahead) < self.depth:
            self.ahead.append(self.pool.submit(sample_batch, self.seed, self.index, self.guard.index))
            self.index += 1
        return self.ahead.popleft().result()

    def next(self) -> dict:
        for _ in range(100):
            if not self.buffer:
                tasks, prints = self._next_batch()
                self.buffer = list(zip(tasks, prints.words, self.guard.screen(prints)))[::-1]
            while self.buffer:
                task, n_words, (token_digest, bands, ruled_out) = self.buffer.pop()
                if self.guard.admit(task["key"], token_digest, bands, ruled_out):
                    task["words"] = n_words
                    return task
        raise RuntimeError("demo generators ran out of new tasks; lower `logs` or add templates")
