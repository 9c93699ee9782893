"""`flywheel serve`: register the deployments of flows/deployments.py, then run a worker.

Choice: deployments live in work pools (`cpu`, `gpu`, both of the `process` type)
rather than `prefect.serve(...)`, because `serve` runs every deployment inside the
one process that called it, so a GPU stage would run wherever `serve` happens to
run. With pools, `flywheel serve --pool cpu` registers everything and runs the CPU
worker; a GPU machine runs `prefect worker start --pool gpu` (or `flywheel serve
--pool gpu`) and only picks up `gpu` deployments. Registering again updates each
deployment in place, so a changed cron in flywheel.toml reaches the UI on the next
`flywheel serve`.

Without a Prefect server there is no UI and no scheduler, so this refuses to run
when `PREFECT_API_URL` is unset rather than starting Prefect's temporary server.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli.show import plain, print_error, rich_console
from storage.config_file import ConfigError, lake_settings, load_section

if TYPE_CHECKING:
    from flows.deployments import ScheduleConfig

NO_SERVER = ("flywheel serve needs a Prefect server: set PREFECT_API_URL, e.g. "
             "PREFECT_API_URL=http://127.0.0.1:4200/api after `prefect server start` "
             "(without a server there is no UI and no schedule).")


def serve_command(
    pool: Annotated[str, typer.Option(help="Work pool to run a worker for after registering: cpu, gpu or none.")] = "cpu",
    register: Annotated[bool, typer.Option(help="Register (create or update) the deployments first.")] = True,
    healthcheck: Annotated[bool, typer.Option(help="Serve the worker's /health on PREFECT_WORKER_WEBSERVER_PORT.")] = False,
) -> None:
    """Register flywheel's deployments and schedules with the Prefect server and run a worker."""
    from flows.deployments import POOLS, ScheduleConfig

    console = rich_console()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if pool not in (*POOLS, "none"):
        print_error(console, f"--pool must be cpu, gpu or none, got {pool!r}")
        raise typer.Exit(2)
    api_url = _api_url()
    if not api_url:
        print_error(console, NO_SERVER)
        raise typer.Exit(2)
    try:
        schedule = load_section(ScheduleConfig, "schedule")
        settings = lake_settings()
    except ConfigError as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    unreachable = asyncio.run(_check_server())
    if unreachable:
        print_error(console, f"Prefect server at {api_url} is not reachable: {unreachable}")
        raise typer.Exit(2)
    if register:
        for line in register_deployments(schedule, settings, str(Path.cwd())):
            console.print(line)  # flywheel's own words, with their markup
    if pool != "none":
        from prefect.workers.process import ProcessWorker

        console.print(f"worker for pool [bold]{pool}[/bold] polling {plain(api_url)}")
        asyncio.run(ProcessWorker(work_pool_name=pool).start(with_healthcheck=healthcheck))


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or ""


async def _check_server() -> str:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        error = await client.api_healthcheck()
    return "" if error is None else str(error)


async def ensure_pools() -> None:
    """Create the `cpu` and `gpu` process pools when missing; existing pools are left as they are."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    from flows.deployments import POOLS

    template = ProcessWorker.get_default_base_job_template()
    async with get_client() as client:
        for name in POOLS:
            try:
                await client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
            except ObjectAlreadyExists:
                pass


def register_deployments(schedule: ScheduleConfig, settings, working_dir: str) -> list[str]:
    """Create or update every deployment whose flow exists; one line of text per deployment.

    Synchronous on purpose: Prefect's `to_deployment`/`apply` return coroutines when
    called inside an event loop, and plain calls read more simply here."""
    from flows.deployments import load_deployments

    asyncio.run(ensure_pools())
    lines = []
    for deployment in load_deployments(schedule, settings, working_dir):
        deployment_id = deployment.apply()
        when = ", ".join(_describe(s.schedule) for s in deployment.schedules or []) or "on demand"
        lines.append(f"registered [bold]{deployment.name}[/bold] (pool {deployment.work_pool_name}, {when}) id {deployment_id}")
    return lines


def _describe(schedule) -> str:
    if getattr(schedule, "cron", None):
        return f"cron '{schedule.cron}' {schedule.timezone or 'UTC'}"
    return f"every {schedule.interval.total_seconds():.0f}s"
