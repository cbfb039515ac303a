"""``broker dashboard``: the web dashboard on the embedded store, for one user, on 127.0.0.1."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from broker.cli.app import ConfigOption, UsageError, app, err_console

# How long the dashboard's sign-in token stays valid unless the running dashboard renews it.
TOKEN_LIFETIME = timedelta(minutes=15)


@app.command()
def dashboard(
    port: Annotated[int, typer.Option("--port", help="port on 127.0.0.1 (0: any free)")] = 8471,
    config: ConfigOption = None,
) -> None:
    """Open the dashboard on this machine's store; prints a sign-in token that is revoked when it stops."""
    import signal
    import socket
    import sys
    import threading

    import uvicorn
    from fastapi import FastAPI

    from broker.api.serving import server_config
    from broker.backends.local.provisioner import LocalWorld
    from broker.clock import WallClock
    from broker.config.settings import load_settings
    from broker.store import open_store
    from broker.tokens import create_api_token, extend_api_token, revoke_api_token
    from broker.web.app import mount_dashboard
    from broker.web.session import ADMIN_TEAM

    if not 0 <= port <= 65535:
        raise UsageError(f"--port: expected 0 to 65535, got {port}")
    settings = load_settings(config)
    store = open_store(settings.database_url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        store.dispose()
        raise UsageError(f"--port: cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None
    world = LocalWorld.load(settings.home)
    web = FastAPI(title="spot broker dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    from broker.config.teams import fair_share_config

    mount_dashboard(web, store, world.clock if world is not None else WallClock(), settings.home,
                    fair_share_config(settings))
    # Short-lived and kept alive while the dashboard runs: killed with SIGKILL, it leaves a token
    # that expires on its own within TOKEN_LIFETIME.
    issued = create_api_token(store, ADMIN_TEAM, TOKEN_LIFETIME)
    stopped = threading.Event()

    def keep_alive() -> None:
        while not stopped.wait(TOKEN_LIFETIME.total_seconds() / 3):
            extend_api_token(store, issued.token_id, TOKEN_LIFETIME)

    threading.Thread(target=keep_alive, name="dashboard-token", daemon=True).start()
    # uvicorn re-raises SIGTERM once it has shut down; raised as SystemExit, it reaches the ``finally``.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    err_console.print(f"dashboard at {url} (Ctrl-C stops it); sign in with this token, valid until it stops:",
                      highlight=False)
    print(issued.token, flush=True)
    try:
        uvicorn.Server(server_config(web, log_level="warning")).run(sockets=[sock])
    finally:
        stopped.set()
        revoke_api_token(store, issued.token_id)
        store.dispose()
