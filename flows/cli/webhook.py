"""`flywheel webhook`: serve the signed deployment triggers of flows/webhook/app.py."""
from __future__ import annotations

import os
from typing import Annotated

import typer

from flows.http_server import KEEP_ALIVE_S
from storage.config_file import ConfigError, lake_settings, load_section


def webhook_command(
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0 in a container).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    access_log: Annotated[bool, typer.Option(help="Log one line per request.")] = True,
) -> None:
    """Serve signed webhooks that trigger flywheel deployments (and MinIO bucket events)."""
    import uvicorn
    from prefect.settings import PREFECT_API_URL

    from flows.webhook.app import WebhookConfig, create_app

    if not PREFECT_API_URL.value():
        typer.echo("error: flywheel webhook creates runs on a Prefect server: set PREFECT_API_URL "
                   "(e.g. http://127.0.0.1:4200/api)", err=True)
        raise typer.Exit(2)
    try:
        cfg = load_section(WebhookConfig, "webhook")
        settings = lake_settings()
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    uvicorn.run(create_app(cfg, settings), host=host, port=port, access_log=access_log, log_level="info",
                timeout_keep_alive=KEEP_ALIVE_S)
