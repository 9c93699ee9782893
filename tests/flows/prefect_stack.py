"""Real servers for the operations tests and bench/webhook.py: Prefect server, webhook,
and docker-compose's services run natively (`run_cycle_through_stack`).

Started once per session with its own PREFECT_HOME. The scheduler service is
off so the only flow runs that exist are the ones a test created: "this request
created nothing" is then a plain count.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tests import services


@dataclass(frozen=True)
class PrefectServer:
    api_url: str
    ui_url: str
    env: dict
    """Environment for child processes that talk to this server."""


def prefect_env(home: Path, api_url: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
               PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING",
               # runs the tests create are never picked up; marking them Late only adds writes
               PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED="false")
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def start_prefect(home: Path, database_url: str = "") -> tuple[subprocess.Popen, PrefectServer]:
    """database_url: e.g. postgresql+asyncpg://...; empty = SQLite in home, which answers
    "database is locked" under concurrent run creation, so load tests use PostgreSQL."""
    port = services.free_port()
    home.mkdir(parents=True, exist_ok=True)
    prefect = str(Path(sys.executable).parent / "prefect")
    log = open(home / "server.log", "wb")
    # the UI (a browser app) calls the API at PREFECT_UI_API_URL, which must name our port
    env = {**prefect_env(home), "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    proc = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    api_url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited:\n{(home / 'server.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"{api_url}/health", timeout=2).json() is True:
                return proc, PrefectServer(api_url, f"http://127.0.0.1:{port}", prefect_env(home, api_url))
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    services.stop(proc)
    raise RuntimeError(f"prefect server not healthy after 120s:\n{(home / 'server.log').read_text()[-3000:]}")




def start_prefect_on_postgres(workdir: Path) -> tuple[list, PrefectServer]:
    """A Prefect server on an embedded PostgreSQL (as in docker-compose); returns (stoppers, server)."""
    workdir.mkdir(parents=True, exist_ok=True)
    pg, _ = services.start_postgres(workdir / "pg")
    try:
        proc, server = start_prefect(workdir / "prefect", f"postgresql+asyncpg://postgres@/postgres?host={workdir / 'pg'}")
    except BaseException:
        pg.cleanup()
        raise
    return [lambda: services.stop(proc), pg.cleanup], server


def flywheel_bin() -> str:
    return str(Path(sys.executable).parent / "flywheel")


def register(server: PrefectServer, workdir: Path, extra_env: dict | None = None) -> str:
    """`flywheel serve --pool none` in workdir: registers the deployments, returns its output."""
    env = {**server.env, **(extra_env or {})}
    done = subprocess.run([flywheel_bin(), "serve", "--pool", "none"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"flywheel serve failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def start_webhook(server: PrefectServer, workdir: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """`flywheel webhook` on a free loopback port; returns (process, base URL) once /healthz answers."""
    port = services.free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log = open(workdir / "webhook.log", "ab")
    proc = subprocess.Popen([flywheel_bin(), "webhook", "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
                            cwd=workdir, env={**server.env, **env}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"webhook exited:\n{(workdir / 'webhook.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    services.stop(proc)
    raise RuntimeError(f"webhook not healthy after 90s:\n{(workdir / 'webhook.log').read_text()[-3000:]}")


def count_runs(server: PrefectServer) -> int:
    return httpx.post(f"{server.api_url}/flow_runs/count", json={}, timeout=30).json()


def read_runs(server: PrefectServer, ids: list[str]) -> list[dict]:
    runs: list[dict] = []
    for start in range(0, len(ids), 200):
        body = {"flow_runs": {"id": {"any_": ids[start:start + 200]}}, "limit": 200}
        runs += httpx.post(f"{server.api_url}/flow_runs/filter", json=body, timeout=30).json()
    return runs


def register_in_process(server: PrefectServer, workdir: Path, schedule=None) -> list[str]:
    """What `flywheel serve --pool none` does, without paying for a CLI start (~10 s here)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deployments import ScheduleConfig
    from flows.cli.serve import register_deployments
    from storage.settings import LakeSettings

    with temporary_settings({PREFECT_API_URL: server.api_url}):
        return register_deployments(schedule or ScheduleConfig(), LakeSettings(home=workdir / ".flywheel"), str(workdir))


# --- docker-compose's services, natively ---------------------------------------------

STACK_SECRET = "stack-secret-0123456789abcdef"
BIN = Path(sys.executable).parent
# A cycle small enough for 2 cores (tests/flows/test_flywheel.py has the stage config).
CYCLE_BODY = {"params": {"cycle_id": "stack-cycle", "rounds": 1, "tasks_per_round": 40, "samples_per_task": 8,
                         "eval_samples": 2}}
# The gate's threshold in the stack's flywheel.toml: its reason names it, which shows the
# gpu worker's flow run read the file (domain_tolerance 1: no domain check reason hides it).
STACK_MIN_GAIN = -0.25


@dataclass(frozen=True)
class StackRun:
    """What `run_cycle_through_stack` did; the services are stopped by the time it returns."""

    settings: Any
    ingest: dict
    """flow_run_id, state and the landed file's uri of the signed POST to /hooks/ingest."""
    cycle: dict
    """flow_run_id, state and cycle_id of the signed POST to /hooks/flywheel-cycle."""
    dask_task_prefixes: list[str]
    dask_workers: int
    logs: dict[str, Path]

    def tails(self, *names: str) -> str:
        return "\n".join(f"--- {n}\n{self.logs[n].read_text(errors='replace')[-4000:]}" for n in names)


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
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


def drop_pending_runs(server: PrefectServer) -> None:
    """Runs other tests created and nobody picked up: a worker started now must not run them."""
    body = {"flow_runs": {"state": {"type": {"any_": ["SCHEDULED", "PENDING"]}}}, "limit": 200}
    pending = httpx.post(f"{server.api_url}/flow_runs/filter", timeout=60, json=body).json()
    while pending:
        for run in pending:
            httpx.delete(f"{server.api_url}/flow_runs/{run['id']}", timeout=60)
        pending = httpx.post(f"{server.api_url}/flow_runs/filter", timeout=60, json=body).json()


def wait_for_run(server: PrefectServer, run_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{server.api_url}/flow_runs/{run_id}", timeout=30).json()["state"]["type"]
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return state
        time.sleep(1)
    return "TIMED_OUT"


def seed_lake(settings, workdir: Path) -> tuple[str, str]:
    """Bucket, a tiny SFT-warmed production model, an eval set, two landed files; returns their uris
    (a few logs for the ingest deployment, arithmetic failures for the cycle)."""
    from storage.lake import open_lake
    from storage.objects import ObjectStore
    from tasks.curate.evalsets import register_evalset
    from tasks.release.models import register_model
    from tests.flows.test_flywheel import _log, warm_policy
    from tests.tasks.logs import write_logs

    train, held = warm_policy(workdir)
    evalset = workdir / "arith.jsonl"
    evalset.write_text("".join(json.dumps({"id": f"e{i}", "domain": "math", "prompt": f"What is {a}+{b}?",
                                           "reference": {"answer": str(a + b)}}) + "\n"
                               for i, (a, b) in enumerate(held)))
    failures = workdir / "traffic.jsonl"
    failures.write_text("".join(json.dumps(_log(i, a, b)) + "\n" for i, (a, b) in enumerate(train[:40])))
    store = ObjectStore(settings)
    store.ensure_bucket()
    landing = f"{settings.landing_prefix}2026-12-02/"
    ingest_uri = store.upload(write_logs(workdir / "stack.jsonl", 3, seed=5, extra_lines=["{not json"]),
                              settings.s3_bucket, landing + "stack.jsonl")
    cycle_uri = store.upload(failures, settings.s3_bucket, landing + "traffic.jsonl")
    con = open_lake(settings)
    try:
        register_evalset(con, "arith", evalset)
        register_model(con, settings, workdir / "sft-model", "stack test: tiny SFT model")
    finally:
        con.close()
    return ingest_uri, cycle_uri


def signed_post(url: str, payload: dict) -> dict:
    from flows.webhook.signatures import sign

    body = json.dumps(payload).encode()
    resp = httpx.post(url, content=body, timeout=60,
                      headers={"Flywheel-Signature": sign(STACK_SECRET, int(time.time()), body)})
    if resp.status_code != 202:
        raise AssertionError(f"{url}: {resp.status_code} {resp.text}")
    return resp.json()


def run_cycle_through_stack(server: PrefectServer, s3, workdir: Path) -> StackRun:
    """Start what docker-compose starts (besides the Prefect server and S3, which the caller
    runs), trigger `ingest` then `flywheel-cycle` with signed POSTs, wait for both, stop."""
    from storage.settings import LakeSettings
    from tests.flows.test_flywheel import SMALL_CONFIG

    # the operator's way to size a cycle: flywheel.toml where `flywheel serve` runs, which
    # is the working directory of every flow run it registers
    # (math rows score in-process by default; the stack sends every row to its Dask worker)
    (workdir / "flywheel.toml").write_text(
        f"{SMALL_CONFIG}\n[cycle.gate]\nmin_gain = {STACK_MIN_GAIN}\ndomain_tolerance = 1.0\n"
        "[cycle.evaluate.fanout]\nin_process = []\n"
        "[cycle.verify.fanout]\nin_process = []\n")
    settings = LakeSettings(home=workdir / "home", s3_endpoint=s3.endpoint, s3_bucket=f"stack-{uuid.uuid4().hex[:8]}",
                            s3_access_key=s3.access_key, s3_secret_key=s3.secret_key)
    scheduler, dash, worker_dash, cpu_health, gpu_health = (services.free_port() for _ in range(5))
    env = {**server.env, "FLYWHEEL_HOME": str(settings.home), "FLYWHEEL_S3_ENDPOINT": settings.s3_endpoint,
           "FLYWHEEL_S3_BUCKET": settings.s3_bucket, "FLYWHEEL_S3_ACCESS_KEY": settings.s3_access_key,
           "FLYWHEEL_S3_SECRET_KEY": settings.s3_secret_key, "FLYWHEEL_WEBHOOK_SECRET": STACK_SECRET,
           "DASK_SCHEDULER_ADDRESS": f"tcp://127.0.0.1:{scheduler}", "PREFECT_WORKER_WEBSERVER_HOST": "127.0.0.1",
           "PREFECT_WORKER_QUERY_SECONDS": "2", "OMP_NUM_THREADS": "1"}
    drop_pending_runs(server)
    started: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        started["dask-scheduler"] = spawn([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port",
                                           str(scheduler), "--dashboard-address", f"127.0.0.1:{dash}"],
                                          env, workdir, "dask-scheduler")
        started["dask-worker"] = spawn([str(BIN / "dask"), "worker", env["DASK_SCHEDULER_ADDRESS"], "--nworkers", "1",
                                        "--nthreads", "1", "--dashboard-address", f"127.0.0.1:{worker_dash}"],
                                       env, workdir, "dask-worker")
        started["cpu-worker"] = spawn([flywheel_bin(), "serve", "--pool", "cpu", "--healthcheck"],
                                      {**env, "PREFECT_WORKER_WEBSERVER_PORT": str(cpu_health)}, workdir, "cpu-worker")
        started["gpu-worker"] = spawn([str(BIN / "prefect"), "worker", "start", "--pool", "gpu", "--type", "process",
                                       "--with-healthcheck"],
                                      {**env, "PREFECT_WORKER_WEBSERVER_PORT": str(gpu_health)}, workdir, "gpu-worker")
        ingest_uri, cycle_uri = seed_lake(settings, workdir)  # while the services start
        for name, port in (("dask-scheduler", dash), ("dask-worker", worker_dash), ("cpu-worker", cpu_health),
                           ("gpu-worker", gpu_health)):
            wait_http(f"http://127.0.0.1:{port}/health", *started[name])
        hook, hook_url = start_webhook(server, workdir, env)
        started["webhook"] = (hook, workdir / "webhook.log")

        ingest = signed_post(f"{hook_url}/hooks/ingest", {"paths": [ingest_uri], "cycle_id": "stack-test"})
        ingest.update(uri=ingest_uri, state=wait_for_run(server, ingest["flow_run_id"], 300))
        cycle = signed_post(f"{hook_url}/hooks/flywheel-cycle",
                            {"params": {**CYCLE_BODY["params"], "landing": [cycle_uri]}})
        cycle.update(cycle_id=CYCLE_BODY["params"]["cycle_id"], state=wait_for_run(server, cycle["flow_run_id"], 600))
        prefixes, workers = _dask_usage(env["DASK_SCHEDULER_ADDRESS"])
    finally:
        for proc, _ in reversed(started.values()):
            services.stop(proc)
    return StackRun(settings, ingest, cycle, prefixes, workers, {name: log for name, (_, log) in started.items()})


def _dask_usage(address: str) -> tuple[list[str], int]:
    """Which task kinds the native scheduler ran, and how many workers it had."""
    from distributed import Client

    with Client(address, timeout=30) as client:
        prefixes = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
        return prefixes, len(client.scheduler_info()["workers"])
