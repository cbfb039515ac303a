"""The CLI's client of `broker serve`: bad URLs and answers that are not the broker's are one clear line."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from broker.cli.client import BrokerClient, ClientError


@pytest.mark.parametrize("url", ["garbage", "ftp://host", "http://", "http://127.0.0.1:99999", "http://[::1", ""])
def test_a_url_that_is_no_server_is_refused_naming_the_flag(url: str) -> None:
    with pytest.raises(ClientError, match=r"^--server: expected a URL"):
        BrokerClient(url, "token")


class _NotTheBroker(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html>a proxy's error page</html>" if self.path.startswith("/v1/jobs") else b"{\"detail\": \"x\"}"
        self.send_response(200 if self.path.split("?")[0] == "/v1/jobs" else 502)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_the_broker() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotTheBroker)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_answers_that_are_not_the_brokers_are_one_line(not_the_broker: str) -> None:
    with BrokerClient(not_the_broker, "token") as client:
        with pytest.raises(ClientError, match="answered 200 with no JSON: <html>a proxy's error page"):
            client.jobs()
        with pytest.raises(ClientError, match=r"^the broker answered 502: <html>"):
            client.job("j-1")
        with pytest.raises(ClientError, match="answered 200 with no JSON"):  # the kept-alive connection goes on
            client.jobs()


def test_a_closed_port_is_one_line_naming_the_url() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClientError, match=rf"^cannot reach the broker at http://127.0.0.1:{port}: "):
        BrokerClient(f"http://127.0.0.1:{port}", "token").jobs()
