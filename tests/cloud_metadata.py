"""Local stand-ins for the clouds' instance metadata services: EC2's IMDSv2, GCE's metadata server and
Azure's Instance Metadata Service (Scheduled Events).

Each speaks the real wire format. EC2 answers a ``PUT /latest/api/token`` (with a TTL header) with a
session token and a ``GET`` only with that token; it serves ``spot/instance-action`` and the
rebalance recommendation once set, else 404. GCE answers ``/computeMetadata/v1/instance/...`` only with
``Metadata-Flavor: Google``, sends an ``ETag`` and the same header back, and holds a
``wait_for_change=true`` request until the value moves off ``last_etag`` or ``timeout_sec``
runs out. Azure answers only with ``Metadata: true``, lists events as ``{"DocumentIncarnation",
"Events": [...]}``, and takes ``{"StartRequests": [{"EventId": ...}]}`` posted back.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class FakeImds:
    """EC2's IMDSv2 for one instance."""

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


@dataclass
class FakeGce:
    values: dict[str, str] = field(default_factory=lambda: {"preempted": "FALSE", "maintenance-event": "NONE",
                                                             "id": "4520031799277581759"})
    raw: dict[str, bytes] = field(default_factory=dict)  # path -> a garbage body served instead
    waits: int = 0  # wait_for_change requests received
    changed: threading.Condition = field(default_factory=threading.Condition)

    def set(self, path: str, value: str) -> None:
        with self.changed:
            self.values[path] = value
            self.changed.notify_all()


def _etag(value: str) -> str:
    return hashlib.md5(value.encode()).hexdigest()[:16]


@contextmanager
def gce_server(state: FakeGce) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, etag: str | None = None) -> None:
            self.send_response(status)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            if etag:
                self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, b"Missing required header: Metadata-Flavor")
                return
            path = url.path.removeprefix("/computeMetadata/v1/instance/")
            if path in state.raw:
                self._send(200, state.raw[path])
                return
            if path not in state.values:
                self._send(404, b"Not Found")
                return
            if query.get("wait_for_change") == "true":
                state.waits += 1
                deadline = time.monotonic() + float(query.get("timeout_sec", "300"))
                with state.changed:
                    while _etag(state.values[path]) == query.get("last_etag") and time.monotonic() < deadline:
                        state.changed.wait(max(deadline - time.monotonic(), 0.0))
            value = state.values[path]
            self._send(200, value.encode(), _etag(value))

    server, url = _serve(Handler)
    try:
        yield url
    finally:
        with state.changed:
            state.changed.notify_all()
        server.shutdown()
        server.server_close()


@dataclass
class FakeAzureImds:
    vm_name: str = "broker-j-1-c1-head"
    events: list[dict[str, Any]] = field(default_factory=list)
    incarnation: int = 1
    garbage: bytes | None = None
    posted: list[dict[str, Any]] = field(default_factory=list)
    rejected_headers: int = 0

    def preempt(self, resources: list[str], not_before: str = "Mon, 19 Sep 2016 18:29:47 GMT") -> str:
        event_id = f"C7061BAC-AFDC-4513-B24B-{len(self.events):012d}"
        self.events.append({"EventId": event_id, "EventStatus": "Scheduled", "EventType": "Preempt",
                            "ResourceType": "VirtualMachine", "Resources": resources, "NotBefore": not_before,
                            "Description": "", "EventSource": "Platform", "DurationInSeconds": -1})
        self.incarnation += 1
        return event_id


@contextmanager
def azure_server(state: FakeAzureImds) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            if self.headers.get("Metadata") != "true":
                state.rejected_headers += 1
                self._send(400, json.dumps({"error": "Bad request. Required metadata header not specified"}).encode())
                return False
            return True

        def do_GET(self) -> None:
            if not self._authorised():
                return
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            if url.path == "/metadata/instance/compute/name" and query.get("format") == "text":
                self._send(200, state.vm_name.encode(), "text/plain")
            elif url.path == "/metadata/instance":
                self._send(200, json.dumps({"compute": {"name": state.vm_name}}).encode())
            elif url.path == "/metadata/scheduledevents" and query.get("api-version") == "2020-07-01":
                body = state.garbage if state.garbage is not None else json.dumps(
                    {"DocumentIncarnation": state.incarnation, "Events": state.events}).encode()
                self._send(200, body)
            else:
                self._send(404, b'{"error": "Not found"}')

        def do_POST(self) -> None:
            if not self._authorised():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.posted.append(body)
            started = {r["EventId"] for r in body.get("StartRequests", [])}
            state.events = [e for e in state.events if e["EventId"] not in started]
            state.incarnation += 1
            self._send(200, b"")

    server, url = _serve(Handler)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
