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
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING

from tasks.demo_domains import sample_domain, sample_task
from tasks.demo_similarity import words

if TYPE_CHECKING:
    from tasks.demo_guard import Guard

BATCH = 1024
PARALLEL_FROM_LOGS = 20_000  # below this, starting worker interpreters costs more than it saves


def sample_batch(seed: int, index: int, size: int = BATCH) -> list[tuple[dict, list[str]]]:
    """Batch `index` of candidate tasks for `seed`, each with its prompt's words."""
    rng = random.Random(f"flywheel-demo:{seed}:tasks:{index}")
    tasks = [sample_task(sample_domain(rng), rng) for _ in range(size)]
    return [(task, words(task["prompt"])) for task in tasks]


def worker_count(logs: int, requested: int) -> int:
    """Processes drawing batches: `requested` if set, else all cores but one for large runs."""
    if requested:
        return requested
    return 0 if logs < PARALLEL_FROM_LOGS else max(1, min(4, (os.cpu_count() or 1) - 1))


class Candidates:
    """Clean tasks the guard admits, in a fixed order whatever the number of workers."""

    def __init__(self, seed: int, guard: Guard, workers: int = 0) -> None:
        self.seed, self.guard, self.index, self.buffer = seed, guard, 0, []
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) if workers else None
        self.ahead: deque[Future] = deque()
        self.depth = 2 * workers

    def __enter__(self) -> Candidates:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _next_batch(self) -> list[tuple[dict, list[str]]]:
        if not self.pool:
            self.index += 1
            return sample_batch(self.seed, self.index - 1)
        while len(self.ahead) < self.depth:
            self.ahead.append(self.pool.submit(sample_batch, self.seed, self.index))
            self.index += 1
        return self.ahead.popleft().result()

    def next(self) -> dict:
        for _ in range(100):
            if not self.buffer:
                batch = self._next_batch()
                screened = self.guard.screen([tokens for _, tokens in batch])
                self.buffer = [(task, tokens, *s) for (task, tokens), s in zip(batch, screened)][::-1]
            while self.buffer:
                task, tokens, bands, ruled_out = self.buffer.pop()
                if self.guard.admit(task["key"], tokens, bands, ruled_out):
                    task["words"] = len(tokens)
                    return task
        raise RuntimeError("demo generators ran out of new tasks; lower `logs` or add templates")
