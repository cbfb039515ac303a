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


class _LosesTheFirstAnswer(BaseHTTPRequestHandler):
    """A proxy in front of the broker that passes every request on but drops the first answer, as a
    network that times out after the broker stored the job would."""

    upstream = ""
    dropped = 0

    def do_POST(self) -> None:
        import http.client
        from urllib.parse import urlsplit

        body = self.rfile.read(int(self.headers["Content-Length"]))
        target = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(target.hostname or "", target.port, timeout=60)
        conn.request("POST", self.path, body=body, headers={k: v for k, v in self.headers.items() if k != "Host"})
        answer = conn.getresponse()
        text = answer.read()
        conn.close()
        if type(self).dropped == 0:
            type(self).dropped += 1
            self.close_connection = True  # the job is stored; the client never hears of it
            return
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args: object) -> None:
        pass


def test_a_submission_whose_answer_was_lost_is_sent_again_and_stored_once(tmp_path: object) -> None:
    import time
    from pathlib import Path

    from sqlalchemy import select

    from broker.api.app import BackgroundServer, create_app
    from broker.clock import WallClock
    from broker.intake import Intake
    from broker.store import open_store
    from broker.store.tables import JobRow
    from broker.tokens import create_api_token

    assert isinstance(tmp_path, Path)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    broker = BackgroundServer(create_app(store, WallClock(), Intake(tmp_path, "local", frozenset({("V100", 1)}))))
    broker.start()
    deadline = time.time() + 60
    while not broker.server.started and time.time() < deadline:
        time.sleep(0.05)
    _LosesTheFirstAnswer.upstream, _LosesTheFirstAnswer.dropped = broker.url, 0
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _LosesTheFirstAnswer)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        token = create_api_token(store, "alpha").token
        with BrokerClient(f"http://127.0.0.1:{proxy.server_address[1]}", token) as client:
            job = client.submit("name: t\nresources:\n  accelerators: V100:1\nrun: echo hi\n")
        with store.transaction() as s:
            assert [row.id for row in s.scalars(select(JobRow))] == [job["job_id"]]
        assert _LosesTheFirstAnswer.dropped == 1
    finally:
        proxy.shutdown()
        proxy.server_close()
        broker.stop()
        store.dispose()
