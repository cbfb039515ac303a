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
    backend: Annotated[str | None, typer.Option(help="where clusters come from: local or skypilot (as on launch)",
                                                envvar="BROKER_BACKEND", show_envvar=True)] = None,
) -> None:
    """Run the broker as a service; start one per machine on a shared PostgreSQL for high availability."""
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UsageError(f"--log-level: expected debug, info, warning or error, got {log_level[:80]!r}")
    if backend is not None and backend not in ("local", "skypilot"):
        raise UsageError(f"--backend: expected local or skypilot, got {backend[:80]!r}")
    from broker.config.settings import load_settings  # after the options are checked: it imports Pydantic
    from broker.service.logs import configure_logging
    from broker.service.runner import Service

    settings = load_settings(config, serve_host=host, serve_port=port, backend=backend)
    configure_logging(f"{socket.gethostname()}:{os.getpid()}", log_level.upper())
    Service(settings).run()
