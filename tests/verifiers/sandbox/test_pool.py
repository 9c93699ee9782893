"""Warm sandbox workers: shared by threads, placed in cgroups, replaced when they die."""

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from verifiers.sandbox import runner as sandbox

from verifiers.sandbox import pool as sandbox_pool
from verifiers.sandbox.runner import SandboxConfig, run_python
from verifiers.sandbox.cgroup import CgroupParent

FAST = SandboxConfig(timeout_s=2.0, cpu_s=2)


@pytest.fixture(autouse=True)
def _fresh_pool():
    sandbox.shutdown()
    yield
    sandbox.shutdown()


def _children(recursive: bool, keep) -> list[psutil.Process]:
    """The test process's children for which keep(p) holds. Children of earlier tests in
    this long-lived process may exit while we look, or be zombies not yet reaped (no
    command line, no parents): they are left out."""
    def kept(p: psutil.Process) -> bool:
        try:
            return keep(p)
        except psutil.NoSuchProcess:  # ZombieProcess is one
            return False
    return [p for p in psutil.Process().children(recursive=recursive) if kept(p)]


def _zygotes() -> list[psutil.Process]:
    """The innermost python of each sandbox worker (the one that forks the runs); other
    python children of the test process (e.g. math-verify helpers) are not zygotes."""
    return _children(True, lambda p: p.name().startswith("python") and not p.children()
                     and any(a.name() == "bwrap" for a in p.parents()))


def _bwrap_children() -> list[psutil.Process]:
    """The test process's sandbox workers."""
    return _children(False, lambda p: "bwrap" in " ".join(p.cmdline()))


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test starts from no warm workers, whatever earlier tests in this process left."""
    sandbox.shutdown()
    yield
    sandbox.shutdown()


def test_concurrent_callers_from_threads_get_their_own_results():
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run_python(f"print({i} * {i})", config=FAST), range(24)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(24)]

def test_workers_run_inside_their_own_pids_cgroup():
    run_python("pass", config=FAST)
    workers = _bwrap_children()
    assert workers
    for proc in workers:
        for member in [proc] + proc.children(recursive=True):
            assert f"pids:/flywheel-{os.getpid()}/w" in Path(f"/proc/{member.pid}/cgroup").read_text()

def test_without_a_writable_cgroup_runs_still_work_and_say_so(monkeypatch):
    """Simulates a host with no writable pids cgroup (e.g. an unprivileged container)."""
    monkeypatch.setattr(sandbox_pool, "open_cgroup_parent",
                        lambda: CgroupParent("none", reason="cgroupfs is read-only here"))
    try:
        result = run_python("print('still isolated')", config=FAST)
    finally:
        sandbox.shutdown()
    assert result.stdout == "still isolated\n"
    assert "no pids cgroup (cgroupfs is read-only here)" in result.detail

def test_a_dead_worker_is_replaced_transparently():
    run_python("pass", config=FAST)
    (zygote,) = _zygotes()
    zygote.kill()
    psutil.wait_procs([zygote], timeout=5)
    assert run_python("print('after')", config=FAST).stdout == "after\n"
    assert _zygotes() and _zygotes()[0].pid != zygote.pid


@pytest.mark.parametrize("padding", [0, 4 << 20], ids=["job-fits-the-pipe", "job-larger-than-the-pipe"])
def test_a_hung_worker_is_abandoned_after_its_timeout_and_replaced(padding):
    run_python("pass", config=FAST)
    (zygote,) = _zygotes()
    zygote.suspend()  # SIGSTOP: it never takes the job (or never answers it)
    started = time.monotonic()
    result = run_python("#" + "x" * padding + "\nprint(1)", config=FAST)
    elapsed = time.monotonic() - started
    assert result.status == "timeout" and "stopped answering" in result.detail
    assert elapsed < FAST.timeout_s + sandbox_pool._HOST_GRACE_S + 2
    assert not zygote.is_running() or zygote.status() == psutil.STATUS_ZOMBIE
    assert run_python("print('next')", config=FAST).stdout == "next\n"


_FORK_SCENARIO = """
import multiprocessing, psutil
from verifiers.sandbox.runner import run_python
from tests.verifiers.sandbox.test_pool import FAST, _zygotes

def run_in_child(queue):
    queue.put(run_python("import os; print(os.getpid())", config=FAST).stdout)

if __name__ == "__main__":
    run_python("pass", config=FAST)
    parent_workers = {p.pid for p in _zygotes()}
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=run_in_child, args=(queue,))
    child.start()
    assert queue.get(timeout=30) == "1\\n"
    child.join(timeout=30)
    assert child.exitcode == 0, child.exitcode
    # The child's workers died with it; the parent's were neither used up nor replaced.
    assert {p.pid for p in _zygotes()} == parent_workers
    assert run_python("print('parent')", config=FAST).stdout == "parent\\n"
    print("ok")
"""


def test_a_forked_process_builds_its_own_pool_and_leaves_the_parents_alone(tmp_path):
    # A fresh interpreter: a fork of the long-lived pytest process would also inherit
    # every other library's finalizers, which is not what this test is about.
    script = tmp_path / "fork_scenario.py"
    script.write_text(_FORK_SCENARIO)
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
