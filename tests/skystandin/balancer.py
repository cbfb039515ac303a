"""The address in front of the replicas (``public_url``): each request goes to the first replica that answers.

Node agents report to one URL whichever replica leads, as they would through a load balancer.
"""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class Balancer:
    def __init__(self) -> None:
        self.backends: list[str] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> Balancer:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        balancer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                for backend in list(balancer.backends):
                    try:
                        answer = httpx.request(self.command, backend + self.path, content=body, headers=headers,
                                               timeout=30)
                    except httpx.TransportError:
                        continue  # that replica is down: the next one
                    with contextlib.suppress(OSError):  # the agent gave up waiting: nothing to tell it
                        self.send_response(answer.status_code)
                        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                        self.send_header("Content-Length", str(len(answer.content)))
                        self.end_headers()
                        self.wfile.write(answer.content)
                    return
                self.send_response(502)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
