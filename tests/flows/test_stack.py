"""docker-compose's services, run natively, driven end to end through the webhook.

The same commands the compose file runs (Prefect server on PostgreSQL, an S3 server,
`flywheel serve --pool cpu --healthcheck`, `flywheel webhook`, `dask scheduler`,
`dask worker`), on loopback. A signed POST names a landing file; the cpu worker picks
up the run, the ingest flow writes the lake, and the rows are read back.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from flows.signatures import sign
from storage.lake import open_lake
from storage.objects import ObjectStore
from storage.settings import LakeSettings
from tests import services
from tests.flows.prefect_stack import flywheel_bin, start_webhook
from tests.tasks.logs import write_logs

SECRET = "stack-secret-0123456789abcdef"
BIN = Path(sys.executable).parent


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy after {timeout}s:\n{log.read_text()[-3000:]}")


def spawn(argv: list[str], env: dict, workdir: Path, name: str) -> tuple[subprocess.Popen, Path]:
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, log


@pytest.fixture
def stack(prefect_server, s3_server, tmp_path):
    settings = LakeSettings(home=tmp_path / "home", s3_endpoint=s3_server.endpoint,
                            s3_bucket=f"stack-{uuid.uuid4().hex[:8]}", s3_access_key=s3_server.access_key,
                            s3_secret_key=s3_server.secret_key)
    scheduler_port, dash, worker_dash, health = (services.free_port() for _ in range(4))
    env = {**prefect_server.env, "FLYWHEEL_HOME": str(settings.home), "FLYWHEEL_S3_ENDPOINT": settings.s3_endpoint,
           "FLYWHEEL_S3_BUCKET": settings.s3_bucket, "FLYWHEEL_S3_ACCESS_KEY": settings.s3_access_key,
           "FLYWHEEL_S3_SECRET_KEY": settings.s3_secret_key, "FLYWHEEL_WEBHOOK_SECRET": SECRET,
           "DASK_SCHEDULER_ADDRESS": f"tcp://127.0.0.1:{scheduler_port}",
           "PREFECT_WORKER_WEBSERVER_HOST": "127.0.0.1", "PREFECT_WORKER_WEBSERVER_PORT": str(health),
           "PREFECT_WORKER_QUERY_SECONDS": "2"}
    _drop_pending_runs(prefect_server)  # runs other tests created must not reach this worker
    procs = []
    try:
        procs.append(spawn([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(scheduler_port),
                            "--dashboard-address", f"127.0.0.1:{dash}"], env, tmp_path, "scheduler"))
        procs.append(spawn([str(BIN / "dask"), "worker", env["DASK_SCHEDULER_ADDRESS"], "--nworkers", "1",
                            "--nthreads", "1", "--dashboard-address", f"127.0.0.1:{worker_dash}"],
                           env, tmp_path, "dask-worker"))
        procs.append(spawn([flywheel_bin(), "serve", "--pool", "cpu", "--healthcheck"], env, tmp_path, "cpu-worker"))
        for (proc, log), url in zip(procs, (f"http://127.0.0.1:{dash}/health", f"http://127.0.0.1:{worker_dash}/health",
                                            f"http://127.0.0.1:{health}/health")):
            wait_http(url, proc, log)
        hook, hook_url = start_webhook(prefect_server, tmp_path, env)
        procs.append((hook, tmp_path / "webhook.log"))
        yield {"settings": settings, "webhook": hook_url, "env": env, "workdir": tmp_path}
    finally:
        for proc, _ in reversed(procs):
            services.stop(proc)


def _drop_pending_runs(server) -> None:
    pending = httpx.post(f"{server.api_url}/flow_runs/filter", timeout=60, json={
        "flow_runs": {"state": {"type": {"any_": ["SCHEDULED", "PENDING"]}}}, "limit": 200}).json()
    while pending:
        for run in pending:
            httpx.delete(f"{server.api_url}/flow_runs/{run['id']}", timeout=60)
        pending = httpx.post(f"{server.api_url}/flow_runs/filter", timeout=60, json={
            "flow_runs": {"state": {"type": {"any_": ["SCHEDULED", "PENDING"]}}}, "limit": 200}).json()


def test_a_signed_post_lands_logs_in_the_lake_through_the_whole_stack(prefect_server, stack, tmp_path):
    settings = stack["settings"]
    landing = write_logs(tmp_path / "stack.jsonl", 3, seed=5, extra_lines=["{not json"])
    store = ObjectStore(settings)
    store.ensure_bucket()
    uri = store.upload(landing, settings.s3_bucket, f"{settings.landing_prefix}2026-12-02/stack.jsonl")

    body = json.dumps({"paths": [uri], "cycle_id": "stack-test"}).encode()
    resp = httpx.post(f"{stack['webhook']}/hooks/ingest", content=body, timeout=60,
                      headers={"Flywheel-Signature": sign(SECRET, int(time.time()), body)})
    assert resp.status_code == 202, resp.text
    state = _wait_for_run(prefect_server, resp.json()["flow_run_id"], stack["workdir"])
    assert state == "COMPLETED"

    con = open_lake(settings, read_only=True)
    try:
        logs = con.execute("SELECT count(*) FROM failure_logs WHERE cycle_id = 'stack-test'").fetchone()[0]
        bad = con.execute("SELECT count(*) FROM quarantine WHERE cycle_id = 'stack-test'").fetchone()[0]
        sources = con.execute("SELECT source_uri FROM ingest_batches WHERE cycle_id = 'stack-test'").fetchall()
    finally:
        con.close()
    assert (logs, bad, sources) == (3, 1, [(uri,)])

    from distributed import Client

    with Client(stack["env"]["DASK_SCHEDULER_ADDRESS"], timeout=30) as client:
        assert len(client.scheduler_info()["workers"]) == 1


def _wait_for_run(server, run_id: str, workdir: Path, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{server.api_url}/flow_runs/{run_id}", timeout=30).json()["state"]["type"]
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            if state != "COMPLETED":
                print((workdir / "cpu-worker.log").read_text()[-5000:])
            return state
        time.sleep(1)
    raise AssertionError(f"run {run_id} not finished after {timeout}s:\n{(workdir / 'cpu-worker.log').read_text()[-5000:]}")
