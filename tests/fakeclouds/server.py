"""A local HTTP server standing in for one cloud's APIs: real wire formats, injected faults, latency.

Each cloud module here gives a ``route(request)`` (which API call is this?), an ``answer(request)``
(the body the real service would send) and an ``error(route, status, code)`` (the real error body).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def param(self, name: str, default: str = "") -> str:
        values = self.query.get(name)
        return values[0] if values else default


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Fault:
    status: int
    code: str | None
    times: int | None  # None: forever


class FakeCloud:
    """Subclasses implement ``route``, ``answer`` and ``error`` for one cloud's APIs."""

    def route(self, request: Request) -> str:
        raise NotImplementedError

    def answer(self, request: Request, route: str, base_url: str) -> Response:
        raise NotImplementedError

    def error(self, route: str, status: int, code: str | None) -> Response:
        raise NotImplementedError


class FakeServer:
    """Serves one ``FakeCloud`` on 127.0.0.1 with a thread per request."""

    def __init__(self, cloud: FakeCloud, latency: float = 0.0) -> None:
        self.cloud = cloud
        self.latency = latency
        self.requests: Counter[str] = Counter()
        self._faults: dict[str, list[Fault]] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail(self, route: str, status: int, times: int | None = 1, code: str | None = None) -> None:
        """Answer the next ``times`` calls of ``route`` (None: every call) with ``status``."""
        with self._lock:
            self._faults.setdefault(route, []).append(Fault(status, code, times))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _next_fault(self, route: str) -> Fault | None:
        with self._lock:
            queue = self._faults.get(route) or []
            if not queue:
                return None
            fault = queue[0]
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    queue.pop(0)
            return fault

    def _serve(self, request: Request) -> Response:
        route = self.cloud.route(request)
        with self._lock:
            self.requests[route] += 1
        if self.latency:
            time.sleep(self.latency)
        fault = self._next_fault(route)
        if fault is not None:
            return self.cloud.error(route, fault.status, fault.code)
        return self.cloud.answer(request, route, self.url)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        serve: Callable[[Request], Response] = self._serve

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(self.command, parts.path, parse_qs(parts.query, keep_blank_values=True),
                                  {k.lower(): v for k, v in self.headers.items()}, body)
                try:
                    response = serve(request)
                except Exception as exc:  # a bug in the fake must show, not hang the client
                    response = Response(599, f"fake server error: {exc!r}".encode(), "text/plain")
                with contextlib.suppress(OSError):  # a client that went away (a killed broker) hears nothing
                    self.send_response(response.status)
                    self.send_header("Content-Type", response.content_type)
                    self.send_header("Content-Length", str(len(response.body)))
                    for name, value in response.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(response.body)

            do_GET = do_POST = _handle

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
