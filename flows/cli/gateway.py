"""`flywheel gateway`: serve the OpenAI API in front of the production model (flows/gateway/app.py)."""
from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from flows.http_server import KEEP_ALIVE_S
from storage.config_file import ConfigError, lake_settings, load_section


def gateway_command(
    host: Annotated[str | None, typer.Option(help="Interface to listen on (0.0.0.0 in a container).")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (default 8100).")] = None,
    upstream: Annotated[str | None, typer.Option(
        help="An OpenAI-compatible server to forward to (FLYWHEEL_GATEWAY_UPSTREAM); without one the "
             "gateway starts `vllm serve` of the production model and follows promotions.")] = None,
    upstream_version: Annotated[str | None, typer.Option(
        help="The model version --upstream serves, logged with each call (default: its first model id).")] = None,
    access_log: Annotated[bool, typer.Option(help="Log one line per request (never headers or keys).")] = True,
) -> None:
    """Serve the OpenAI API in front of the production model; log every call and feedback."""
    import uvicorn

    from flows.gateway.app import create_app
    from flows.gateway.config import GatewayConfig

    overrides = {k: v for k, v in (("host", host), ("port", port), ("upstream", upstream),
                                   ("upstream_version", upstream_version)) if v is not None}
    try:
        cfg = dataclasses.replace(load_section(GatewayConfig, "gateway"), **overrides)
        settings = lake_settings()
        app = create_app(cfg, settings)
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if problem := _cannot_serve(cfg, settings):
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(1)
    # graceful stop (SIGTERM, Ctrl-C) runs the app's shutdown: the spool is shipped before exit
    uvicorn.run(app, host=cfg.host, port=cfg.port, access_log=access_log, log_level="info",
                timeout_graceful_shutdown=30, timeout_keep_alive=KEEP_ALIVE_S)


def _cannot_serve(cfg, settings) -> str | None:
    """Why the gateway would have nothing to serve (its upstream not answering; no lake or
    no production model in managed mode), else None: said in one line before uvicorn
    starts, not as its startup traceback. The start checks again, and says so too."""
    import asyncio

    import httpx

    from flows.gateway.upstreams import UpstreamError, base_url, probe
    from tasks.release.models import production_problem

    if not cfg.upstream:
        return production_problem(settings)

    async def probed() -> None:
        async with httpx.AsyncClient() as client:
            await probe(client, base_url(cfg.upstream))

    try:
        asyncio.run(probed())
    except UpstreamError as exc:
        return f"{exc}; start it first, or leave out --upstream to serve the production model"
    return None
