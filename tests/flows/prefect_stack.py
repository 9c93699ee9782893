"""Real servers for the operations tests and bench/webhook.py: Prefect server, webhook.

Started once per session with its own PREFECT_HOME (SQLite). The scheduler service is
off so the only flow runs that exist are the ones a test created: "this request
created nothing" is then a plain count.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

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
    from flows.serve_cmd import register_deployments
    from storage.settings import LakeSettings

    with temporary_settings({PREFECT_API_URL: server.api_url}):
        return register_deployments(schedule or ScheduleConfig(), LakeSettings(home=workdir / ".flywheel"), str(workdir))
