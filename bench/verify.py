"""Code verification: the flywheel sandbox against its peers, like for like, in one run.

Every way runs the same N code verifications: the program the code verifier really runs
(`code_harness.py`, fed {nonce, program, tests, entry_point} on stdin), judged by the
verifier's own `interpret_run`. The ways:
  1. flywheel's sandbox as the product runs it: `run_python` on warm bubblewrap workers
     (namespaces per run, cgroups, rlimits, no capabilities);
  2. an unisolated warm fork server: one long-lived `python3 -I -S` per thread with the
     zygote's imports preloaded that, per program, forks a child which compiles and runs
     it with the same rlimits, timeout and output capture, in a fresh work dir, and no
     namespaces, cgroups or capability drop. It speaks the sandbox's own framing and uses
     its worker's exec, collect and classify code, so the difference is isolation alone:
     the honest upper bound for a warm design;
  3. bubblewrap per run: a fresh `bwrap ... python3 -I -S -c HARNESS` per verification with
     the workers' bubblewrap flags, less --cap-add (nothing inside builds namespaces), with
     size-capped tmpfs on /tmp and /dev/shm as each sandbox run gets, and the program as
     pid 1 of its namespace as in a sandbox run (--as-pid-1; bwrap's own init would also
     be orphaned unreaped, hiding the program's CPU time from us); it sets no rlimits or
     cgroups, which only flatters it;
  4. bare `python3 -I -S -c HARNESS` per run, no isolation: a reference line.
Each way runs serially and on `--threads` threads (default: the sandbox pool's width).

A fifth of the cases are wrong answers and a tenth syntax errors; every way must give
every case the verdict status it was built to get, or the bench stops (a way that
disagrees is a bug). Absolute times on a shared 2-core machine mean little; the ratios
are the result. The ways take turns on slices of the cases, in an order rotated each
slice, so a burst of load from other processes lands on all of them; the ratios' spread
is their min..max over the slices.
CPU time per run (this process and everything below it) barely moves with other
processes' load, and cores / CPU-per-run estimates the rate on otherwise idle cores.

    .venv/bin/python bench/verify.py [--n 400] [--rounds 8] [--threads 2]
"""

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from queue import SimpleQueue

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verifiers import code  # noqa: E402
from verifiers.sandbox import worker as sandbox_worker  # noqa: E402
from verifiers.sandbox.pool import WorkerSpec, bwrap_command  # noqa: E402
from verifiers.sandbox.runner import RunResult, SandboxConfig, run_python, shutdown  # noqa: E402

PYTHON = os.path.realpath(sys.executable)
CONFIG = SandboxConfig()
JOB = {k: v for k, v in asdict(CONFIG).items() if k not in ("isolation", "bwrap_path", "python_path")}
HARNESS = code._HARNESS_SOURCE  # what code.verify sends to the sandbox
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}  # what bubblewrap leaves a worker
_HOST_GRACE_S = 5.0  # as the pool's: a margin over the run's own timeout

# The fork server: the zygote's loop, imports and exec, minus every isolation step.
FORK_SERVER = r"""
import gc, os, shutil, signal, sys, time
import atexit, builtins, ctypes, resource, types  # the zygote's preloads
sys.path.insert(0, sys.argv[1])
from verifiers.sandbox import worker

def run_job(job, source, stdin, work):
    stdin_fd = os.memfd_create("stdin")
    os.write(stdin_fd, stdin)
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    os.mkdir(work)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            for target, fd in ((0, stdin_fd), (1, out_w), (2, err_w)):
                os.dup2(fd, target)
            os.chdir(work)
            worker._set_rlimits(job)
            os.closerange(3, 1 << 16)
        except BaseException:
            os._exit(125)
        os._exit(worker._exec_main(source))
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    try:
        state = worker.collect_output(pid, [out_r, err_r], started + job["timeout_s"], job["max_output_bytes"])
        try:
            os.killpg(pid, signal.SIGKILL)  # whatever the program left in its session
        except ProcessLookupError:
            pass
        _, status, usage = os.wait4(pid, 0)
    finally:
        os.close(out_r)
        os.close(err_r)
        shutil.rmtree(work, ignore_errors=True)
    header = worker.classify(job, state, status, usage.ru_utime + usage.ru_stime)
    header["duration_ms"] = (time.monotonic() - started) * 1000
    return (header, *state["output"])

chan_in, chan_out = os.dup(0), os.dup(1)
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
gc.collect()
gc.freeze()
worker.send_frame(chan_out, {"ready": True})
runs = 0
while (frame := worker.read_frame(chan_in)) is not None:
    runs += 1
    job, source, stdin = frame
    worker.send_frame(chan_out, *run_job(job, source.decode(), stdin, f"{sys.argv[2]}/run{runs}"))
"""


def make_cases(n: int) -> list[dict]:
    """N distinct code tasks with replies; each knows the verdict status it must get."""
    cases = []
    for i in range(n):
        expected = "wrong" if i % 5 == 1 else "format_error" if i % 10 == 4 else "ok"
        body = {"ok": f"{i} * x + {i % 7}", "wrong": f"{i} * x + {i % 7 + 1}", "format_error": f"{i} * x +"}
        solution = f"def affine(x):\n    return {body[expected]}\n"
        tests = ("def check(candidate):\n"
                 + "".join(f"    assert candidate({x}) == {i * x + i % 7}\n" for x in (0, 1, 2, 5, 11)))
        spec = {"entry_point": "affine", "tests": tests}
        completion = f"Here is the function:\n```python\n{solution}```\n"
        # What code.verify builds for the sandbox, built once so every way runs the same bytes.
        nonce = secrets.token_hex(16)
        payload = json.dumps({"nonce": nonce, "program": code.extract_program(completion, "affine"),
                              "tests": tests, "entry_point": "affine"})
        cases.append({"spec": spec, "completion": completion, "expected": expected,
                      "nonce": nonce, "stdin": payload.encode()})
    return cases


def judged(case: dict, status: str, exit_code, out: bytes, err: bytes, truncated=False, detail="") -> str:
    result = RunResult(status=status, exit_code=exit_code, stdout=out.decode("utf-8", "replace"),
                       stderr=err.decode("utf-8", "replace"), output_truncated=truncated,
                       duration_ms=0.0, detail=detail)
    return code.interpret_run(result, case["nonce"]).status


def run_sandboxed(case: dict) -> str:
    return code.interpret_run(run_python(HARNESS, stdin=case["stdin"].decode(), config=CONFIG), case["nonce"]).status


def run_process(cmd: list[str], case: dict, cwd: str) -> str:
    try:
        proc = subprocess.run(cmd, input=case["stdin"], capture_output=True, timeout=CONFIG.timeout_s,
                              cwd=cwd, env=ENV)
    except subprocess.TimeoutExpired:
        return judged(case, "timeout", None, b"", b"")
    return judged(case, "ok", proc.returncode, proc.stdout, proc.stderr)


def per_run_bwrap_command() -> list[str]:
    """The workers' bubblewrap command, made to run one harness directly (module doc)."""
    worker_cmd = bwrap_command(WorkerSpec(bwrap=bwrap_path(), python=PYTHON))
    cmd = worker_cmd[:worker_cmd.index(PYTHON, 1)]  # drop the zygote's `python -I -S -c SOURCE`
    at = cmd.index("--cap-add")
    del cmd[at:at + 2]
    size = str(CONFIG.work_dir_mb << 20)
    at = cmd.index("--dir")
    cmd[at:at + 2] = ["--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm",
                      "--hostname", "sandbox"]
    return cmd + ["--as-pid-1", PYTHON, "-I", "-S", "-c", HARNESS]


def bwrap_path() -> str:
    found = shutil.which(CONFIG.bwrap_path)
    if found is None:
        raise SystemExit(f"bubblewrap not found at {CONFIG.bwrap_path!r}; the sandbox needs it too")
    return found


class ForkServers:
    """`width` warm fork servers, each lent to one thread at a time."""

    def __init__(self, width: int, work_root: str):
        self.procs, self.idle = [], SimpleQueue()
        for i in range(width):
            proc = subprocess.Popen([PYTHON, "-I", "-S", "-c", FORK_SERVER, str(ROOT), f"{work_root}/s{i}"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=ENV)
            os.mkdir(f"{work_root}/s{i}")
            ready = sandbox_worker.read_frame(proc.stdout.fileno(), time.monotonic() + 30)
            assert ready and ready[0].get("ready"), f"fork server {i} did not start"
            os.set_blocking(proc.stdin.fileno(), False)  # as the pool's: job writes honour the deadline
            self.procs.append(proc)
            self.idle.put(proc)

    def run(self, case: dict) -> str:
        proc = self.idle.get()
        try:
            deadline = time.monotonic() + JOB["timeout_s"] + _HOST_GRACE_S
            sandbox_worker.send_frame(proc.stdin.fileno(), JOB, HARNESS.encode(), case["stdin"], deadline=deadline)
            header, out, err = sandbox_worker.read_frame(proc.stdout.fileno(), deadline,
                                                         max_bytes=2 * JOB["max_output_bytes"] + (1 << 20))
        finally:
            self.idle.put(proc)
        return judged(case, header["status"], header.get("exit_code"), out, err,
                      bool(header.get("truncated")), header.get("detail", ""))

    def close(self) -> None:
        for proc in self.procs:
            proc.stdin.close()
            proc.wait(timeout=10)
            proc.stdout.close()


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and everything under it, live or reaped.

    Reaped children (per-run subprocesses, runs reaped by a zygote or fork server) are in
    their reaper's children_* times; live ones (workers, fork servers) in their own.
    """
    total = 0.0
    for proc in [psutil.Process()] + psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue  # ended between listing and reading: its time moved to its reaper
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run_slice(fn, cases: list[dict], threads: int) -> tuple[float, float, list[str], list[float]]:
    """(wall s, CPU s, statuses, latencies s) of fn over cases, serially or on threads."""
    def timed(case: dict) -> tuple[str, float]:
        started = time.perf_counter()
        status = fn(case)
        return status, time.perf_counter() - started

    cpu_before, started = tree_cpu_s(), time.perf_counter()
    if threads == 1:
        results = [timed(case) for case in cases]
    else:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(timed, cases))
    wall = time.perf_counter() - started
    return wall, tree_cpu_s() - cpu_before, [s for s, _ in results], [t for _, t in results]


def check_agreement(label: str, cases: list[dict], statuses: list[str]) -> None:
    wrong = [(c["expected"], s) for c, s in zip(cases, statuses) if s != c["expected"]]
    assert not wrong, f"{label}: {len(wrong)} of {len(cases)} verdicts differ (expected, got): {wrong[:5]}"


def print_table(n: int, stats: dict) -> None:
    cores = os.cpu_count() or 2
    print(f"{'':<34} {'runs/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU/run ms':>11} "
          f"{f'{cores} idle cores (from CPU)':>26}")
    for label, s in stats.items():
        wall, cpu = sum(w for w, _ in s["slices"]), sum(c for _, c in s["slices"])
        lat = sorted(s["latencies"])
        p50, p99 = statistics.median(lat) * 1000, lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000
        cpu_ms = cpu / n * 1000
        print(f"{label:<34} {n / wall:8.1f} {p50:8.2f} {p99:8.2f} {cpu_ms:11.2f} {cores * 1000 / cpu_ms:19.1f} runs/s")


def print_ratios(stats: dict, threads: int) -> None:
    """sandbox / peer: throughput over all slices, min..max over slices, and from CPU."""
    print("\nratios, flywheel sandbox / peer (runs/s; the same verifications; spread = min..max over slices):")
    for width in (1, threads):
        mine = stats[way_label("flywheel sandbox", width)]
        for peer, goal in (("fork server, unisolated", "  goal >= 0.5"), ("bwrap per run", ""),
                           ("bare python3 per run", "")):
            other = stats[way_label(peer, width)]
            overall = sum(w for w, _ in other["slices"]) / sum(w for w, _ in mine["slices"])
            per_slice = [w_other / w_mine for (w_mine, _), (w_other, _) in zip(mine["slices"], other["slices"])]
            by_cpu = sum(c for _, c in other["slices"]) / sum(c for _, c in mine["slices"])
            print(f"  {way_label('sandbox', width) + ' / ' + peer:<45} = {overall:5.2f}x "
                  f"(slices {min(per_slice):.2f}..{max(per_slice):.2f}; from CPU {by_cpu:.2f}x){goal}")


def way_label(way: str, width: int) -> str:
    return f"{way}, {'serial' if width == 1 else f'{width} threads'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="verifications per way (default 400)")
    parser.add_argument("--rounds", type=int, default=8,
                        help="the ways take turns on n/rounds cases each, so load changes hit all alike")
    parser.add_argument("--threads", type=int, default=max(2, os.cpu_count() or 2),
                        help="concurrency of the threaded ways (default: the sandbox pool's width)")
    args = parser.parse_args()
    cases = make_cases(args.n)
    print(f"{args.n} code verifications per way in {args.rounds} interleaved slices; interpreter {PYTHON}; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}\n")
    for case in cases[:10]:  # the bench's payloads are what the product's code.verify scores
        assert code.verify(case["spec"], case["completion"], sandbox=CONFIG).status == case["expected"]
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-", dir="/dev/shm") as work_root:
        servers = ForkServers(args.threads, work_root)
        bwrap_cmd, bare_cmd = per_run_bwrap_command(), [PYTHON, "-I", "-S", "-c", HARNESS]
        ways = {"flywheel sandbox": run_sandboxed, "fork server, unisolated": servers.run,
                "bwrap per run": lambda case: run_process(bwrap_cmd, case, work_root),
                "bare python3 per run": lambda case: run_process(bare_cmd, case, work_root)}
        runs = [(way_label(way, width), fn, width) for width in (1, args.threads) for way, fn in ways.items()]
        for label, fn, width in runs:  # warm: every sandbox worker and fork server started
            check_agreement(label, cases[:2 * width], run_slice(fn, cases[:2 * width], width)[2])
        stats = {label: {"slices": [], "latencies": []} for label, _, _ in runs}
        for r in range(args.rounds):
            chunk = cases[r::args.rounds]
            # Rotating the order spreads what one way leaves behind (the kernel's deferred
            # teardown of namespaces, a burst of load) over all the ways that follow it.
            for label, fn, width in runs[r % len(runs):] + runs[:r % len(runs)]:
                wall, cpu, statuses, latencies = run_slice(fn, chunk, width)
                check_agreement(label, chunk, statuses)
                stats[label]["slices"].append((wall, cpu))
                stats[label]["latencies"] += latencies
        servers.close()
    shutdown()
    print_table(args.n, stats)
    print(f"  every way gave every case its expected status ({', '.join(sorted({c['expected'] for c in cases}))}); "
          "CPU counts this process and all below it")
    print_ratios(stats, args.threads)
    print(f"\nload average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
