"""``broker dashboard``: the web dashboard on the embedded store, for one user, on 127.0.0.1."""

from __future__ import annotations

from typing import Annotated

import typer

from broker.cli.app import ConfigOption, UsageError, app, err_console


@app.command()
def dashboard(
    port: Annotated[int, typer.Option("--port", help="port on 127.0.0.1 (0: any free)")] = 8471,
    config: ConfigOption = None,
) -> None:
    """Open the dashboard on this machine's store; prints a sign-in token that is revoked when it stops."""
    import socket

    import uvicorn
    from fastapi import FastAPI

    from broker.api.serving import server_config
    from broker.backends.local.provisioner import LocalWorld
    from broker.clock import WallClock
    from broker.config.settings import load_settings
    from broker.store import open_store
    from broker.tokens import create_api_token, revoke_api_token
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
    issued = create_api_token(store, ADMIN_TEAM)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    err_console.print(f"dashboard at {url} (Ctrl-C stops it); sign in with this token, valid until it stops:",
                      highlight=False)
    print(issued.token, flush=True)
    try:
        uvicorn.Server(server_config(web, log_level="warning")).run(sockets=[sock])
    finally:
        revoke_api_token(store, issued.token_id)
        store.dispose()
