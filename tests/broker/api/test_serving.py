"""Slow and half-sent requests on real sockets: the server closes them instead of holding them forever.

The limits are set short here; every wait is on the server closing the socket, with a ceiling many
times the limit, so a slow machine makes a test slower, never wrong.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from broker.api.app import BackgroundServer
from broker.api.serving import ConnectionLimits

LIMITS = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=1,
                          max_connections_per_client=4, max_connections=8)
CEILING_S = 30.0


@pytest.fixture
def server() -> Iterator[BackgroundServer]:
    yield from _serve(LIMITS)


@pytest.fixture
def patient_server() -> Iterator[BackgroundServer]:
    """Headers may take a minute here, so only the connection caps can close a connection early."""
    yield from _serve(ConnectionLimits(header_timeout_s=60, body_timeout_s=60, max_connections_per_client=4,
                                       max_connections=8))


def _serve(limits: ConnectionLimits) -> Iterator[BackgroundServer]:
    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    @app.post("/echo")
    async def echo(body: dict[str, str]) -> dict[str, str]:
        return body

    running = BackgroundServer(app, connection_limits=limits).start()
    deadline = time.monotonic() + CEILING_S
    while not running.server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield running
    running.stop()


def _connect(server: BackgroundServer, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=CEILING_S, source_address=(source, 0))


def _closed_by_server(sock: socket.socket, drip: bytes = b"") -> bool:
    """Read (dripping ``drip`` a byte at a time meanwhile) until the server closes; False at the ceiling."""
    deadline = time.monotonic() + CEILING_S
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() < deadline:
        if sent < len(drip):
            try:
                sock.sendall(drip[sent:sent + 1])
            except OSError:
                return True
            sent += 1
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def _served(server: BackgroundServer, source: str = "127.0.0.1") -> bool:
    with _connect(server, source) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply.startswith(b"HTTP/1.1 200") and b"pong" in reply


def test_a_connection_that_sends_nothing_is_closed(server: BackgroundServer) -> None:
    with _connect(server) as sock:
        assert _closed_by_server(sock)
    assert _served(server)


def test_headers_sent_a_byte_at_a_time_are_cut_off(server: BackgroundServer) -> None:
    headers = b"GET /ping HTTP/1.1\r\n" + b"".join(b"X-Slow-%d: y\r\n" % n for n in range(2000))
    with _connect(server) as sock:
        assert _closed_by_server(sock, drip=headers)
    assert _served(server)


def test_a_body_that_never_comes_is_cut_off(server: BackgroundServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n{\"a\": \"")
        assert _closed_by_server(sock, drip=b"b" * 5000)


def test_an_idle_kept_alive_connection_is_closed(server: BackgroundServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _closed_by_server(sock)


def test_one_client_cannot_hold_more_than_its_share(patient_server: BackgroundServer) -> None:
    share = 4
    held = [_connect(patient_server) for _ in range(share + 3)]
    try:
        for sock in held:
            sock.sendall(b"GET /ping HTTP/1.1\r\n")  # half a request each
        assert all(_closed_by_server(sock) for sock in held[share:])
        assert _served(patient_server, "127.0.0.2")  # another client is served
    finally:
        for sock in held:
            sock.close()


def test_past_the_cap_the_longest_waiting_half_request_makes_room(patient_server: BackgroundServer) -> None:
    cap = 8
    held = [_connect(patient_server, f"127.0.0.{10 + n}") for n in range(cap)]
    try:
        for sock in held:
            sock.sendall(b"GET /ping HTTP/1.1\r\n")
        assert _served(patient_server)  # a newcomer is served: the oldest half request was closed for it
        assert _closed_by_server(held[0])
    finally:
        for sock in held:
            sock.close()


def test_a_whole_request_is_still_answered(server: BackgroundServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n'
                     b'Connection: close\r\n\r\n{"a": "b"}')
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"a":"b"}')
