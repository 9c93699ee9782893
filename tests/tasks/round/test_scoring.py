import os
import signal
import threading
import time

import pytest
from distributed import Client, LocalCluster, get_task_stream

from tasks.round.scoring import (FanOut, close_local_cluster, local_client, score_rows, split_batches, verify_row,
                                 verify_rollouts, verify_rows)
from verifiers.registry import VerifierConfig
from verifiers.verdict import Verdict

CODE_SPEC = {"entry_point": "add", "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
CONFIG = VerifierConfig()


def mixed_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            body = "a + b" if i % 8 else "a - b"
            rows.append({"id": i, "verifier": "code", "spec": CODE_SPEC, "completion": f"def add(a, b): return {body}"})
        elif kind == 1:
            rows.append({"id": i, "domain": "math", "spec": {"answer": "391"}, "completion": f"\\boxed{{{390 + i % 3}}}"})
        elif kind == 2:
            rows.append({"id": i, "domain": "json", "spec": {"schema": {"type": "object", "required": ["a"]}},
                         "completion": '{"a": 1}' if i % 3 else "none"})
        else:
            rows.append({"id": i, "verifier": "exact", "spec": {"answer": "Paris"}, "completion": "paris." if i % 2 else "Rome"})
    return rows


def strip_latency(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "latency_ms"} for row in rows]


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=50) as local:
        yield local


def test_verify_row_records_verifier_latency_and_id():
    out = verify_row({"id": "r1", "domain": "json", "spec": {"schema": {"type": "object"}}, "completion": "{}"}, CONFIG)
    assert out["id"] == "r1" and out["verifier"] == "json_schema" and out["passed"] and out["latency_ms"] > 0
    unknown = verify_row({"id": "r2", "domain": "poetry", "spec": {}, "completion": "x"}, CONFIG)
    assert unknown["status"] == "format_error" and "poetry" in unknown["detail"]
    assert verify_row(["not", "a", "row"], CONFIG)["status"] == "format_error"


def test_dask_results_identical_to_serial(cluster):
    rows = mixed_rows(48)
    serial = verify_rows(rows, CONFIG)
    fanned = verify_rollouts(rows, CONFIG, scheduler_address=cluster.scheduler_address, batch_size=5, progress=False)
    assert [row["id"] for row in fanned] == list(range(48))
    assert [Verdict.from_dict(row) for row in fanned] == serial
    assert {row["status"] for row in fanned} == {"ok", "wrong", "format_error"}
    assert all(row["latency_ms"] > 0 for row in fanned)


def test_score_rows_fans_out_only_sandboxed_rows_and_keeps_input_order(cluster):
    rows = mixed_rows(40) + [{"id": 40, "verifier": "poetry", "spec": {}, "completion": "x"}]
    before = _verify_task_count(cluster)
    out = score_rows(rows, CONFIG, FanOut(batch_size=2), scheduler_address=cluster.scheduler_address)
    assert [Verdict.from_dict(row) for row in out] == verify_rows(rows, CONFIG)
    assert [row["id"] for row in out] == list(range(41))
    # only the 10 code rows travel, two a batch: math, json, exact and the unknown verifier stay here
    assert _verify_task_count(cluster) == before + 5


def test_rows_without_sandboxed_verifiers_never_touch_dask_unless_told(cluster):
    before = _verify_task_count(cluster)
    rows = [row for row in mixed_rows(40) if row.get("verifier") != "code"]
    in_process = strip_latency(score_rows(rows, CONFIG, scheduler_address=cluster.scheduler_address))
    assert in_process == strip_latency([verify_row(row, CONFIG) for row in rows])
    assert _verify_task_count(cluster) == before
    everything = FanOut(in_process=(), batch_size=8)
    assert len(score_rows(rows, CONFIG, everything, scheduler_address=cluster.scheduler_address)) == 30
    assert _verify_task_count(cluster) == before + 4  # 30 rows, 8 a batch


def test_a_few_rows_still_spread_over_every_worker_thread():
    assert [len(b) for b in split_batches(list(range(3)), 64, 4)] == [1, 1, 1]
    assert [len(b) for b in split_batches(list(range(10)), 64, 4)] == [3, 3, 3, 1]
    assert [len(b) for b in split_batches(list(range(300)), 64, 4)] == [64, 64, 64, 64, 44]


def test_fanout_rejects_unknown_verifiers_and_bad_sizes():
    with pytest.raises(ValueError, match="poetry"):
        FanOut(in_process=("math", "poetry"))
    with pytest.raises(ValueError, match="workers"):
        FanOut(workers=0)


def test_scheduler_address_comes_from_the_environment(cluster, monkeypatch):
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
    before = _verify_task_count(cluster)
    out = verify_rollouts(mixed_rows(8), CONFIG, batch_size=4, progress=False)
    assert len(out) == 8 and _verify_task_count(cluster) >= before + 2


def _verify_task_count(cluster) -> int:
    # Every batch's key passes through the scheduler's transition log.
    return len({t[0] for t in cluster.scheduler.transition_log if str(t[0]).startswith("verify-")})


def test_killed_worker_batch_is_retried_without_duplicates(cluster):
    slow = "import time\ndef add(a, b):\n    time.sleep(0.15)\n    return a + b\n"
    rows = [{"id": i, "verifier": "code", "spec": CODE_SPEC, "completion": slow} for i in range(16)]
    killed: list[int] = []
    killer = threading.Thread(target=_kill_a_busy_worker, args=(cluster.scheduler_address, killed))
    killer.start()
    out = verify_rollouts(rows, CONFIG, scheduler_address=cluster.scheduler_address, batch_size=4, progress=False)
    killer.join()
    assert killed, "no worker was killed mid-batch; the test proved nothing"
    assert [row["id"] for row in out] == list(range(16))
    assert all(row["passed"] for row in out), [row["detail"] for row in out if not row["passed"]]


def _kill_a_busy_worker(address: str, killed: list[int]) -> None:
    """Wait until a worker is running a verify batch, let it get into it, then SIGKILL it."""
    with Client(address) as client:
        pids = client.run(os.getpid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for worker, keys in client.processing().items():
                if any(str(key).startswith("verify-") for key in keys):
                    time.sleep(0.3)
                    pid = pids[worker]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.02)


# The warm local cluster: what a cycle's stages share when no scheduler is named.

@pytest.fixture
def no_scheduler(monkeypatch):
    """No DASK_SCHEDULER_ADDRESS, and no warm cluster before or after the test."""
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    close_local_cluster()
    yield
    close_local_cluster()


def code_rows(n: int) -> list[dict]:
    return [{"id": i, "verifier": "code", "spec": CODE_SPEC,
             "completion": f"def add(a, b): return a {'-' if i == 1 else '+'} b"} for i in range(n)]


def test_a_few_code_rows_are_scored_in_the_sandbox_on_warm_dask_workers(no_scheduler):
    rows = code_rows(3)
    started = time.perf_counter()
    first = score_rows(rows, CONFIG)
    cold = time.perf_counter() - started
    client = local_client()  # the default FanOut's shape: the cluster that call started
    workers = client.run(os.getpid)
    with get_task_stream(client=client) as stream:
        started = time.perf_counter()
        second = score_rows(rows, CONFIG)
        warm = time.perf_counter() - started
    started = time.perf_counter()
    serial = verify_rows(rows, CONFIG)
    in_process = time.perf_counter() - started
    print(f"\n{len(rows)} code rows: first call {cold:.2f} s (cluster start, sandbox pools), warm reuse "
          f"{warm:.3f} s, serial in this process {in_process:.3f} s (warm/serial {warm / in_process:.1f}x)")
    assert [Verdict.from_dict(row) for row in first] == [Verdict.from_dict(row) for row in second] == serial
    assert [row["passed"] for row in second] == [True, False, True]
    # the second call ran on the same worker processes, one batch per row, none in this one
    assert local_client() is client and client.run(os.getpid) == workers
    ran_on = [task["worker"] for task in stream.data if str(task["key"]).startswith("verify-")]
    assert len(ran_on) == 3 and os.getpid() not in {workers[w] for w in ran_on}
    # and each of those workers ran the programs in its own bubblewrap sandbox pool
    pools = client.run(_sandbox_pools)
    assert all(pools[w] for w in ran_on), pools
    assert warm < cold


def _sandbox_pools() -> list[str]:
    from verifiers.sandbox import runner
    return [spec.bwrap for spec in runner._pools]


def test_a_dead_warm_cluster_is_replaced_and_a_closed_one_leaves_no_process(no_scheduler):
    rows = code_rows(2)
    score_rows(rows, CONFIG)
    client = local_client()
    old = set(client.run(os.getpid).values())
    client.cluster.close()  # dies under its owner, as a crashed scheduler would
    assert [row["passed"] for row in score_rows(rows, CONFIG)] == [True, False]
    assert local_client() is not client
    new = set(local_client().run(os.getpid).values())
    assert new.isdisjoint(old)
    close_local_cluster()
    assert not [pid for pid in old | new if _process_exists(pid)]


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_asking_for_another_shape_replaces_the_warm_cluster(no_scheduler):
    assert verify_rollouts([], CONFIG) == []
    rows = mixed_rows(6)
    two = local_client(2, 2)
    out = verify_rollouts(rows, CONFIG, batch_size=2, progress=True, n_workers=1)
    assert strip_latency(out) == strip_latency([verify_row(row, CONFIG) for row in rows])
    assert two.status == "closed" and len(local_client(1, 2).run(os.getpid)) == 1


def test_the_warm_cluster_leaves_this_process_environment_as_it_was(no_scheduler, monkeypatch):
    """Dask's nanny sets OMP_NUM_THREADS=1 (and more) in the spawning process, at start and
    whenever it restarts a worker; a training job started after verification would have
    inherited it and run on one thread."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    for name in ("MKL_NUM_THREADS", "PYTHONHASHSEED", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    verify_rollouts(mixed_rows(2), CONFIG, progress=False, n_workers=1)
    assert dict(os.environ) == before
    client = local_client(1, 2)
    (pid,) = client.run(os.getpid).values()
    os.kill(pid, signal.SIGKILL)  # the nanny starts a new worker
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and set(_worker_pids(client)) in (set(), {pid}):
        time.sleep(0.1)
    assert set(_worker_pids(client)) - {pid}, "the nanny did not restart the worker"
    assert len(verify_rollouts(mixed_rows(2), CONFIG, progress=False, n_workers=1)) == 2
    assert dict(os.environ) == before


def _worker_pids(client) -> list[int]:
    try:
        return list(client.run(os.getpid).values())
    except Exception:  # noqa: BLE001 - a worker that is going away fails the call; ask again
        return []
