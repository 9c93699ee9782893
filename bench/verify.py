"""Code-verification throughput: the flywheel sandbox against bare subprocesses, one run.

The same N small code verifications (a function and a few asserts) run:
  1. bare `python3 -I -S -c PROGRAM`, one subprocess per run, no isolation (the baseline),
     serially and on 2 threads;
  2. `verifiers.sandbox.runner.run_python(PROGRAM)`, fully isolated, serially and on 2 threads;
  3. through Dask on 2 worker processes: `tasks.round.scoring.verify_rollouts` on
     {verifier: "code", spec, completion} rows (the code verifier wraps each program in
     its nonce harness), against a LocalCluster started and warmed before timing.
Absolute times on a shared 2-core machine mean little; the ratios are the result. The
ways take turns on slices of the cases, so a burst of load from other processes lands
on all of them rather than on whichever happened to be running. CPU time per run (this
process and everything below it) is also printed: it barely moves with other processes'
load, and 2 cores / CPU-per-run estimates the rate on 2 otherwise idle cores.

    .venv/bin/python bench/verify.py [--n 400]
"""

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verifiers.sandbox.runner import SandboxConfig, run_python, shutdown  # noqa: E402

PYTHON = os.path.realpath(sys.executable)


def make_cases(n: int) -> list[dict]:
    """N distinct (function, tests) pairs; every one is a correct solution."""
    cases = []
    for i in range(n):
        solution = f"def affine(x):\n    return {i} * x + {i % 7}\n"
        tests = ("def check(candidate):\n"
                 + "".join(f"    assert candidate({x}) == {i * x + i % 7}\n" for x in (0, 1, 2, 5, 11)))
        cases.append({"solution": solution, "tests": tests,
                      "program": f"{solution}\n{tests}\ncheck(affine)\nprint('passed')\n"})
    return cases


def run_bare(program: str) -> bool:
    proc = subprocess.run([PYTHON, "-I", "-S", "-c", program], capture_output=True, text=True, timeout=30)
    return proc.returncode == 0 and proc.stdout == "passed\n"


def run_sandboxed(program: str) -> bool:
    result = run_python(program, config=SandboxConfig())
    return result.status == "ok" and result.exit_code == 0 and result.stdout == "passed\n"


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and everything under it, live or reaped.

    Reaped children (bare subprocesses, finished runs reaped by a zygote) are in their
    reaper's children_* times; live ones (workers, Dask processes) in their own.
    """
    total = 0.0
    for proc in [psutil.Process()] + psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue  # ended between listing and reading: its time moved to its reaper
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run_way(fn, items: list, threads: int) -> tuple[float, float]:
    """(wall, CPU) seconds to run fn over items, serially or on `threads` threads."""
    cpu_before, started = tree_cpu_s(), time.perf_counter()
    if threads == 1:
        oks = [fn(item) for item in items]
    else:
        with ThreadPoolExecutor(threads) as pool:
            oks = list(pool.map(fn, items))
    elapsed = time.perf_counter() - started
    assert all(oks), f"{fn.__name__}: {oks.count(False)} of {len(items)} runs did not pass"
    return elapsed, tree_cpu_s() - cpu_before


@contextmanager
def dask_way(cases: list[dict]):
    """A warm 2-worker LocalCluster and a function that verifies a chunk of cases on it.

    Uses tasks.round.scoring.verify_rollouts (the code verifier, with its nonce harness) when it
    exists, else maps run_python over the cluster; yields (runner, description).
    """
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster) as client:
        try:
            from tasks.round.scoring import verify_rollouts
            from verifiers.registry import VerifierConfig
        except ImportError:
            def run_chunk(chunk: list[dict]) -> bool:
                return all(client.gather(client.map(run_sandboxed, [c["program"] for c in chunk], pure=False)))
            how = "run_python mapped over a LocalCluster (tasks.round.scoring.verify_rollouts missing)"
        else:
            config = VerifierConfig()

            def run_chunk(chunk: list[dict]) -> bool:
                rows = [{"verifier": "code", "spec": {"entry_point": "affine", "tests": c["tests"]},
                         "completion": f"```python\n{c['solution']}```"} for c in chunk]
                verdicts = verify_rollouts(rows, config, scheduler_address=cluster.scheduler_address,
                                           batch_size=max(1, len(rows) // 2), progress=False)
                return all(v["passed"] for v in verdicts)
            how = "tasks.round.scoring.verify_rollouts, code verifier, warm LocalCluster"
        assert run_chunk(cases[:8]), "dask warm-up failed"  # starts each worker's sandbox pool
        yield run_chunk, how


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="verifications per way (default 400)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="the ways take turns on n/rounds cases each, so load changes hit all alike")
    args = parser.parse_args()
    cases = make_cases(args.n)
    chunks = [cases[i::args.rounds] for i in range(args.rounds)]
    print(f"{args.n} code verifications per way in {args.rounds} interleaved rounds; interpreter {PYTHON}; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}\n")
    run_sandboxed(cases[0]["program"])  # one warm worker: process start-up, not a per-run cost
    ways = {
        "bare python3 -I -S subprocess, serial": (run_bare, 1),
        "flywheel sandbox (run_python), serial": (run_sandboxed, 1),
        "bare python3 -I -S subprocess, 2 threads": (run_bare, 2),
        "flywheel sandbox (run_python), 2 threads": (run_sandboxed, 2),
    }
    dask_label = "flywheel through Dask, 2 workers"
    seconds = {label: [0.0, 0.0] for label in [*ways, dask_label]}  # wall, CPU
    with dask_way(cases) as (run_dask_chunk, how):
        ways[dask_label] = (run_dask_chunk, "chunk")
        for chunk in chunks:
            programs = [c["program"] for c in chunk]
            for label, (fn, threads) in ways.items():
                wall, cpu = run_way(fn, [chunk], 1) if threads == "chunk" else run_way(fn, programs, threads)
                seconds[label][0] += wall
                seconds[label][1] += cpu
    shutdown()
    rate = {label: args.n / wall for label, (wall, _) in seconds.items()}
    print(f"{'':<44} {'measured':>14}   {'CPU per run':>11}   {'2 idle cores (from CPU)':>23}")
    for label, (wall, cpu) in seconds.items():
        cpu_ms = cpu / args.n * 1000
        print(f"{label:<44} {rate[label]:8.1f} runs/s   {cpu_ms:8.2f} ms   {2000 / cpu_ms:14.1f} runs/s")
    print(f"  (Dask: {how}; CPU counts this process and all below it: workers, zygotes, Dask)")
    bare_1, bare_2 = rate["bare python3 -I -S subprocess, serial"], rate["bare python3 -I -S subprocess, 2 threads"]
    sandbox_1, sandbox_2 = rate["flywheel sandbox (run_python), serial"], rate["flywheel sandbox (run_python), 2 threads"]
    dask = rate["flywheel through Dask, 2 workers"]
    print("\nratios (flywheel / bare; goal >= 0.9 while fully isolated, and >= 200 isolated runs/s):")
    print(f"  sandbox serial    / bare serial     = {sandbox_1 / bare_1:5.2f}x")
    print(f"  sandbox 2 threads / bare 2 threads  = {sandbox_2 / bare_2:5.2f}x")
    print(f"  Dask 2 workers    / bare 2 threads  = {dask / bare_2:5.2f}x")
    print(f"  best isolated rate on 2 cores       = {max(sandbox_2, dask):6.1f} runs/s"
          f"   (load average now {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
