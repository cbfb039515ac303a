"""The FastAPI application and a small in-process server for the embedded broker."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from broker.api.agent_reports import agent_reports_router
from broker.api.auth import team_dependency
from broker.api.gpu_reports import gpu_reports_router
from broker.api.jobs import jobs_router
from broker.api.limits import Limits, RequestLimits
from broker.api.lists import lists_router
from broker.api.metrics import install_metrics
from broker.api.notices import notices_router
from broker.api.pipelines import pipelines_router
from broker.api.prices import prices_router
from broker.api.reports import reports_router
from broker.api.serving import ConnectionLimits, server_config
from broker.api.teams import teams_router
from broker.api.validation import user_error_response, validation_error_response
from broker.clock import Clock
from broker.config.teams import FairShareConfig
from broker.errors import BrokerError, user_errors
from broker.intake import Intake
from broker.store import Store

if TYPE_CHECKING:
    from broker.reports.settings import BudgetSettings


def create_app(store: Store, clock: Clock, intake: Intake | None = None,
               is_leader: Callable[[], bool] | None = None, limits: Limits | None = None,
               fair_share: FairShareConfig | None = None, budgets: BudgetSettings | None = None) -> FastAPI:
    """The notice API alone (the embedded broker), or with ``intake`` the whole service API."""
    app = FastAPI(title="spot broker", version="1", docs_url=None, redoc_url=None)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    for error in user_errors():
        app.add_exception_handler(error, user_error_response)
    app.include_router(notices_router(store, clock))
    app.include_router(agent_reports_router(store, clock))
    app.include_router(gpu_reports_router(store, clock))

    @app.get("/v1/health")
    async def health() -> dict[str, object]:  # on the event loop: no thread hand-off under load
        return {"status": "ok", "leader": bool(is_leader()) if is_leader is not None else None}

    if intake is not None:
        team = team_dependency(store)
        app.include_router(jobs_router(store, clock, intake, team))
        app.include_router(pipelines_router(store, clock, intake, team))
        app.include_router(lists_router(store, team))
        app.include_router(prices_router(store, team))
        app.include_router(reports_router(store, team))
        install_metrics(app, store, is_leader, clock, fair_share, budgets)
        if fair_share is not None:
            app.include_router(teams_router(store, clock, fair_share, team))
        from broker.web.app import mount_dashboard

        mount_dashboard(app, store, clock, intake.home, fair_share)
    from broker.web.apidocs import mount_api_docs

    mount_api_docs(app)  # /docs: the reference, drawn on the server from /openapi.json
    # Added last, so it is outermost: nothing inside sees a request over a limit.
    app.add_middleware(RequestLimits, limits=limits or Limits())
    return app


START_TIMEOUT_S = 120.0  # a loaded machine starts uvicorn in well under a second; never this slowly


class BackgroundServer:
    """Serve an app on a loopback port chosen by the OS, in a daemon thread."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                 connection_limits: ConnectionLimits | None = None) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host, self.port = self.socket.getsockname()[:2]
        config = server_config(app, connection_limits, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        """Serve; returns once uvicorn listens and has run the app's startup, so a request made right
        after is answered (before, one could be refused or wait on a socket nothing accepted yet)."""
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive():
                raise BrokerError(f"the API server on {self.url} stopped while starting (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the API server on {self.url} did not start within {START_TIMEOUT_S:g} s")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
