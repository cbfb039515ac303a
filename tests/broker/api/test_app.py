"""``BackgroundServer``: ``start()`` returns once the server listens, or says why it never will."""

from __future__ import annotations

import http.client

import pytest
from fastapi import FastAPI

from broker.api.app import BackgroundServer, create_app
from broker.clock import WallClock
from broker.errors import BrokerError
from broker.store import open_store


def test_a_request_made_right_after_start_is_answered(db_url: str) -> None:
    """It returned as soon as the thread began, before uvicorn listened: the agents of an engine that
    had just started could find nobody there."""
    store = open_store(db_url)
    server = BackgroundServer(create_app(store, WallClock())).start()
    try:
        assert server.server.started
        connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
        connection.request("GET", "/v1/health")  # once, no retry
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        server.stop()
        store.dispose()


def test_a_server_that_cannot_start_is_an_error_not_a_silent_return() -> None:
    server = BackgroundServer(FastAPI())
    server.socket.close()  # nothing left to listen on
    with pytest.raises(BrokerError, match="stopped while starting"):
        server.start()
    assert not server.thread.is_alive()
