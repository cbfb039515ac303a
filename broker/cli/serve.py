"""``broker serve``: the long-running service (API on every replica, scheduler and engine on the leader)."""

from __future__ import annotations

import os
import socket
from typing import Annotated

import typer

from broker.cli.app import ConfigOption, UsageError, app


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option("--host", envvar="BROKER_SERVE_HOST", show_envvar=True,
                                             help="address to listen on (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option("--port", envvar="BROKER_SERVE_PORT", show_envvar=True,
                                             help="port to listen on (default 8470; 0: any free)")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error")] = "info",
) -> None:
    """Run the broker as a service; start one per machine on a shared PostgreSQL for high availability."""
    from broker.config.settings import load_settings
    from broker.service.logs import configure_logging
    from broker.service.runner import Service

    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UsageError(f"--log-level: expected debug, info, warning or error, got {log_level!r}")
    settings = load_settings(config, serve_host=host, serve_port=port)
    configure_logging(f"{socket.gethostname()}:{os.getpid()}", log_level.upper())
    Service(settings).run()
