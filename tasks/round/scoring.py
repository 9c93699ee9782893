"""Scoring (verifier, spec, completion) rows, in this process or on Dask workers: what the
rollout stage's waves, the verify and evaluate stages and `flywheel verify` call.

`score_rows` is what stages call: it routes each row by its verifier (`FanOut`).
Verifiers that run no user code (math, exact, json_schema) score a row in well under a
millisecond here, less than shipping it costs (a cycle's 8,192 math rollouts: 1.3 s
in-process, 7.5 s fanned out through a fresh cluster). Every row whose verifier runs user
code (code, in the bubblewrap sandbox) goes to Dask, however few there are: one path for
sandboxed code, the one a cluster deployment runs, and on a warm cluster a stage's handful
of code rows costs a round trip, not a cluster start. Measured on the shared 2-core
machine (medians of 15 calls): a warm call adds ~5-7 ms to scoring 1-3 rows in-process
(18 vs 11 ms for one row) and is faster from ~8 rows (57 vs 66 ms); the first call,
which starts the cluster and the workers' sandbox pools, took 0.6-0.8 s idle and ~2.7 s
under a load of 6 (tests/tasks/round/test_scoring.py prints both on each run).

Where rows run: the external scheduler that `scheduler_address` or DASK_SCHEDULER_ADDRESS
names, else this process's warm LocalCluster (`local_client`): started by the first call
that needs it, reused by every later one (a cycle runs its stages in one process, so the
rollout waves, verify and evaluate of every round and cycle share it, and each worker's
sandbox pool stays warm too), started again if it died, closed at exit or by
`close_local_cluster`. 2 worker processes x 2 threads by default: a row mostly waits on a
subprocess (the sandbox), so two threads per process overlap those waits. Measured on the
shared 2-core machine (warm workers, 400 small code rows; serial = 1.0): 2x1 1.3-1.7x,
1x2 1.3-1.6x, 2x2 1.5-2.2x.

`verify_rows` is the serial reference. `verify_rollouts` cuts the rows into batches (one
Dask task per batch, not per row: a row costs ~1-30 ms and a Dask task ~1 ms of scheduler
overhead plus a round trip), at most `batch_size` rows each and at least one batch per
worker thread, so a few rows still spread over every worker.

Failure handling: when a worker dies, the scheduler reschedules the batches it held
(up to `distributed.scheduler.allowed-failures` deaths per batch) and the nanny starts a
new worker; if a batch still fails (KilledWorker or an error outside the verifier
boundary) it is resubmitted under a new key, up to `batch_attempts` times, and only then
are its rows written as sandbox_error verdicts. Results are placed by batch index, so the
output has exactly one verdict per input row, in input order, whatever order batches
finish in.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from distributed import Client, LocalCluster, as_completed
from distributed.core import Status
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from verifiers import registry
from verifiers.registry import VerifierConfig
from verifiers.verdict import Verdict, failed

ECHOED_KEYS = ("id", "rollout_id")


# A row: {"verifier" or "domain", "spec", "completion", optional "prompt" (the task's
# prompt, which rules that need the question read), optional "id"/"rollout_id"}.
def row_verifier(row: dict, config: VerifierConfig) -> str:
    """The verifier a row asks for: its explicit "verifier", else its "domain" mapped by config."""
    return config.verifier_for(row.get("domain"), row.get("verifier"))


def verify_row(row: dict, config: VerifierConfig) -> dict:
    """One row's verdict as a dict, with the verifier used and latency_ms; never raises."""
    started = time.perf_counter()
    if not isinstance(row, dict):
        return _verdict_row({}, failed("format_error", f"row is a {type(row).__name__}, not an object"), "", 0.0)
    name = _named_verifier(row)
    try:
        name = row_verifier(row, config)
    except ValueError as error:
        verdict = failed("format_error", str(error))
    else:
        prompt = row.get("prompt") if isinstance(row.get("prompt"), str) else None
        verdict = registry.verify(name, row.get("spec"), row.get("completion"), config, prompt=prompt)
    return _verdict_row(row, verdict, name, (time.perf_counter() - started) * 1000)


def _named_verifier(row: dict) -> str:
    # What the output line's "verifier" says when the row's choice is unusable: the name
    # it gave if that is a string, never the text of a list or object it gave instead.
    explicit = row.get("verifier")
    return explicit if isinstance(explicit, str) else ""


def _verdict_row(row: dict, verdict: Verdict, name: str, latency_ms: float) -> dict:
    out = {key: row[key] for key in ECHOED_KEYS if key in row}
    out.update(verdict.to_dict())
    out["verifier"] = name
    out["latency_ms"] = round(latency_ms, 3)
    return out


def verify_rows(rows: list[dict], config: VerifierConfig) -> list[Verdict]:
    """Serial verification, in input order (the reference the Dask path must match)."""
    return [Verdict.from_dict(verify_row(row, config)) for row in rows]


def verify_batch(rows: list[dict], config: VerifierConfig) -> list[dict]:
    """What one Dask task runs."""
    return [verify_row(row, config) for row in rows]


@dataclass(frozen=True)
class FanOut:
    """Which rows `score_rows` sends to Dask, and the shape of the local cluster."""

    in_process: tuple[str, ...] = ("math", "exact", "json_schema")
    """Verifiers scored in the calling process: they run no user code and are cheap. Rows
    of every other verifier go to Dask, however few. A workload heavy in answers
    math-verify must parse (~2 ms a row through its helper) may list fewer, so that those
    rows fan out too."""
    workers: int = 2
    """Worker processes of the local cluster (an external scheduler brings its own)."""
    threads_per_worker: int = 2
    batch_size: int = 64
    """The most rows one Dask task scores; fewer rows are spread one batch per worker thread."""

    def __post_init__(self) -> None:
        unknown = set(self.in_process) - set(registry.VERIFIERS)
        if unknown:
            raise ValueError(f"FanOut.in_process names unknown verifiers {sorted(unknown)}; "
                             f"known: {sorted(registry.VERIFIERS)}")
        if self.workers < 1 or self.threads_per_worker < 1 or self.batch_size < 1:
            raise ValueError("FanOut.workers, threads_per_worker and batch_size must be >= 1")
        object.__setattr__(self, "in_process", tuple(self.in_process))


def score_rows(rows: list[dict], config: VerifierConfig, fanout: FanOut = FanOut(), *,
               scheduler_address: str | None = None, progress: bool = False) -> list[dict]:
    """One verdict dict per row, in input order: cheap verifiers here, the rest on Dask."""
    remote = [i for i, row in enumerate(rows) if _routed_verifier(row, config) not in (None, *fanout.in_process)]
    out: list[dict | None] = [None] * len(rows)
    if remote:
        fanned = verify_rollouts([rows[i] for i in remote], config, scheduler_address=scheduler_address,
                                 batch_size=fanout.batch_size, progress=progress, n_workers=fanout.workers,
                                 threads_per_worker=fanout.threads_per_worker)
        for i, verdict in zip(remote, fanned, strict=True):
            out[i] = verdict
    for i, row in enumerate(rows):
        if out[i] is None:
            out[i] = verify_row(row, config)
    return out


def _routed_verifier(row: dict, config: VerifierConfig) -> str | None:
    try:
        return row_verifier(row, config) if isinstance(row, dict) else None
    except ValueError:
        return None  # an unknown verifier is a format_error verdict, made in-process


def verify_rollouts(rows: list[dict], config: VerifierConfig, *, scheduler_address: str | None = None,
                    batch_size: int = 64, progress: bool = True, n_workers: int = 2,
                    threads_per_worker: int = 2, batch_attempts: int = 3) -> list[dict]:
    """Verdict dicts (plus verifier, latency_ms, echoed id) for `rows`, on a Dask cluster:
    the external one when an address is given or set, else the warm local one."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not rows:
        return []
    address = scheduler_address or os.environ.get("DASK_SCHEDULER_ADDRESS") or None
    batches = split_batches(rows, batch_size, n_workers * threads_per_worker)
    if address is None:
        results = _run_batches(local_client(n_workers, threads_per_worker), batches, config, progress,
                               batch_attempts)
    else:
        # A client per call: connecting costs milliseconds, and a scheduler that restarted
        # between stages is simply found again.
        with Client(address, set_as_default=False) as client:
            results = _run_batches(client, batches, config, progress, batch_attempts)
    out = [verdict for batch in results for verdict in batch]
    assert len(out) == len(rows), "every row gets exactly one verdict"
    return out


def split_batches(rows: list, batch_size: int, slots: int) -> list[list]:
    """Consecutive batches of at most `batch_size` rows, and at least `slots` of them when
    there are that many rows: 3 code rows on 2x2 workers are 3 tasks, not 1."""
    size = max(1, min(batch_size, -(-len(rows) // slots)))
    return [rows[i:i + size] for i in range(0, len(rows), size)]


@dataclass(frozen=True)
class _WarmCluster:
    shape: tuple[int, int]  # (workers, threads per worker)
    cluster: LocalCluster
    client: Client
    pid: int  # the process that started it: a forked child must not use its parent's

    def alive(self) -> bool:
        # A cluster with no worker left (its nannies gave up) would take batches and never
        # run them: that counts as dead too.
        return (self.pid == os.getpid() and self.cluster.status == Status.running
                and self.client.status == "running" and bool(self.cluster.scheduler.workers))


_warm: _WarmCluster | None = None
_warm_lock = threading.Lock()  # stages may call from different Prefect worker threads


def local_client(n_workers: int = 2, threads_per_worker: int = 2) -> Client:
    """A client of this process's warm LocalCluster of that shape: started on first use,
    reused while it runs, started again if it died. One at a time: asking for another
    shape closes the old one, so no cluster is left behind unowned."""
    global _warm
    shape = (n_workers, threads_per_worker)
    with _warm_lock:
        if _warm is not None and (_warm.shape != shape or not _warm.alive()):
            stale, _warm = _warm, None
            if stale.pid == os.getpid():
                _close(stale)
        if _warm is None:
            _warm = _start_cluster(shape)
        return _warm.client


def close_local_cluster() -> None:
    """Stop the warm cluster and its worker processes (also runs at exit); the next call
    that needs one starts a new one."""
    global _warm
    with _warm_lock:
        warm, _warm = _warm, None
    if warm is not None and warm.pid == os.getpid():
        _close(warm)


atexit.register(close_local_cluster)


def _start_cluster(shape: tuple[int, int]) -> _WarmCluster:
    # The scheduler and the nannies live in this process and log every worker and client
    # at INFO into the cycle's own log (Prefect handles the root logger): keep warnings.
    logging.getLogger("distributed").setLevel(logging.WARNING)
    # Workers are fresh interpreters that read Dask's logging config from the environment;
    # without this each one logs its start-up at INFO into the user's terminal.
    quiet = {"DASK_LOGGING__DISTRIBUTED": "error"}
    # Dask's nanny writes its worker settings (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1,
    # PYTHONHASHSEED, ...) into this process's os.environ before it spawns a worker and
    # never takes them back: every later subprocess (a training job, a vLLM worker) then
    # ran on one thread. Put the environment back after the start, and empty each nanny's
    # pre-spawn settings so that a worker restarted mid-cycle does not write them again
    # (the worker still gets them: they are also in the nanny's `env`, applied inside it).
    saved = dict(os.environ)
    try:
        # ":0": the scheduler's HTTP endpoints on a free port (None means 8787, which a
        # second process with its own warm cluster would fight over).
        cluster = LocalCluster(n_workers=shape[0], threads_per_worker=shape[1], processes=True,
                               dashboard_address=":0", silence_logs=logging.ERROR, env=quiet)
    finally:
        _restore_environ(saved)
    for nanny in cluster.workers.values():
        nanny.pre_spawn_env.clear()  # in place: the nanny's worker-process handle shares the dict
    try:
        client = Client(cluster, set_as_default=False)
    except Exception:
        cluster.close()  # not left running unowned
        raise
    return _WarmCluster(shape, cluster, client, os.getpid())


def _close(warm: _WarmCluster) -> None:
    # A cluster that died may fail to close cleanly; its processes are gone either way
    # and there is nothing left to do for the caller, who only wants a fresh one.
    with suppress(Exception):
        warm.client.close()
    with suppress(Exception):
        warm.cluster.close()


def _restore_environ(saved: dict[str, str]) -> None:
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    os.environ.update(saved)


def _run_batches(client: Client, batches: list[list[dict]], config: VerifierConfig,
                 progress: bool, batch_attempts: int) -> list[list[dict]]:
    run_id = uuid.uuid4().hex[:8]
    results: list[list[dict] | None] = [None] * len(batches)
    attempts = [1] * len(batches)

    index_of: dict[str, int] = {}

    def submit(index: int):
        key = f"verify-{run_id}-{index}-try{attempts[index]}"
        index_of[key] = index
        # The config travels with each task (it is tiny): scattered data would die with
        # the workers holding it, and a killed worker must cost one batch, not the run.
        return client.submit(verify_batch, batches[index], config, key=key, pure=False)

    pending = as_completed([submit(i) for i in range(len(batches))], loop=client.loop)
    with _progress(progress, sum(len(b) for b in batches)) as advance:
        for future in pending:
            index = index_of[future.key]
            try:
                batch_result = future.result()
            except Exception as error:  # noqa: BLE001 - a lost batch is retried, then becomes data
                if attempts[index] < batch_attempts:
                    attempts[index] += 1
                    pending.add(submit(index))
                    continue
                batch_result = [_lost_row(row, error) for row in batches[index]]
            if results[index] is None:  # a batch is placed once, even if it ran twice
                results[index] = batch_result
                advance(len(batch_result))
    return results


def _lost_row(row: dict, error: Exception) -> dict:
    verdict = failed("sandbox_error", f"batch lost after retries: {type(error).__name__}: {error}")
    row = row if isinstance(row, dict) else {}
    return _verdict_row(row, verdict, _named_verifier(row), 0.0)


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar (or nothing), as an `advance(n)` callback."""
    if not enabled:
        yield lambda n: None
        return
    # stderr: the CLI may be writing verdict lines to stdout.
    with Progress(TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as bar:
        task = bar.add_task("verify", total=total)
        yield lambda n: bar.advance(task, n)
