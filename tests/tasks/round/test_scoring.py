import os
import signal
import threading
import time

import pytest
from distributed import Client, LocalCluster

from tasks.round.scoring import FanOut, score_rows, verify_row, verify_rollouts, verify_rows
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
    out = score_rows(rows, CONFIG, FanOut(min_rows=5, batch_size=2), scheduler_address=cluster.scheduler_address)
    assert [Verdict.from_dict(row) for row in out] == verify_rows(rows, CONFIG)
    assert [row["id"] for row in out] == list(range(41))
    # only the 10 code rows travel, two a batch: math, json, exact and the unknown verifier stay here
    assert _verify_task_count(cluster) == before + 5


def test_score_rows_below_min_rows_or_all_in_process_never_touches_dask(cluster):
    before = _verify_task_count(cluster)
    rows = mixed_rows(40)
    in_process = strip_latency(score_rows(rows, CONFIG, FanOut(min_rows=11), scheduler_address=cluster.scheduler_address))
    assert in_process == strip_latency([verify_row(row, CONFIG) for row in rows])
    everything = FanOut(in_process=(), min_rows=1, batch_size=8)
    assert len(score_rows(rows, CONFIG, everything, scheduler_address=cluster.scheduler_address)) == 40
    assert _verify_task_count(cluster) == before + 5  # the second call sent all 40 rows


def test_fanout_rejects_unknown_verifiers_and_bad_sizes():
    with pytest.raises(ValueError, match="poetry"):
        FanOut(in_process=("math", "poetry"))
    with pytest.raises(ValueError, match="min_rows"):
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


def test_default_local_cluster_and_empty_input(monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    assert verify_rollouts([], CONFIG) == []
    rows = mixed_rows(6)
    out = verify_rollouts(rows, CONFIG, batch_size=2, progress=True, n_workers=1)
    assert strip_latency(out) == strip_latency([verify_row(row, CONFIG) for row in rows])


def test_a_local_cluster_leaves_this_process_environment_as_it_was(monkeypatch):
    """Dask's nanny sets OMP_NUM_THREADS=1 (and more) in the spawning process; a training
    job started after verification would have inherited it and run on one thread."""
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    before = dict(os.environ)
    verify_rollouts(mixed_rows(2), CONFIG, progress=False, n_workers=1)
    assert dict(os.environ) == before
