"""A local stand-in for EC2's instance metadata service (IMDSv2), for tests of the notice path."""

from __future__ import annotations

import json
import secrets
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeImds:
    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.action: Any = None  # dict, or raw bytes for garbage answers
        self.rebalance: dict[str, str] | None = None
        self.token_requests = 0
        self.reject_next_get = False


def _path(target: str) -> str:
    """The path of a request target, also in the absolute form a client sends through a proxy."""
    return urllib.parse.urlsplit(target).path


@contextmanager
def imds_server(state: FakeImds) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:
            state.token_requests += 1
            if _path(self.path) != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                self._send(400, b"")
                return
            token = secrets.token_hex(8)
            state.tokens.add(token)
            self._send(200, token.encode())

        def do_GET(self) -> None:
            if state.reject_next_get:
                state.reject_next_get = False
                state.tokens.clear()
            if self.headers.get("X-aws-ec2-metadata-token") not in state.tokens:
                self._send(401, b"")
                return
            path = _path(self.path)
            if path == "/latest/meta-data/spot/instance-action" and state.action is not None:
                body = state.action if isinstance(state.action, bytes) else json.dumps(state.action).encode()
                self._send(200, body)
            elif path == "/latest/meta-data/events/recommendations/rebalance" and state.rebalance:
                self._send(200, json.dumps(state.rebalance).encode())
            else:
                self._send(404, b"Not Found")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
