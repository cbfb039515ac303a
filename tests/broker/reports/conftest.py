"""Real local servers for report delivery: aiosmtpd with STARTTLS and login, and an HTTP server
speaking Slack's webhook and Web API wire formats; plus the demo ledger written through the store."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from broker.store import Store, open_store
from tests.broker.reports.ledger import LedgerWriter, demo_ledger

SMTP_USER, SMTP_PASSWORD = "reports", "s3cret-pw"


@pytest.fixture
def demo(db_url: str) -> Iterator[tuple[Store, LedgerWriter]]:
    store = open_store(db_url)
    yield store, demo_ledger(store)
    store.dispose()


@pytest.fixture
def sqlite_demo(tmp_path: Path) -> Iterator[tuple[Store, LedgerWriter]]:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield store, demo_ledger(store)
    store.dispose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return folder / "cert.pem", folder / "key.pem"


@dataclass
class SmtpServer:
    port: int
    mode: str  # starttls | ssl
    messages: list[EmailMessage] = field(default_factory=list)
    recipients: list[list[str]] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)
    tls_seen: list[bool] = field(default_factory=list)
    controller: Any = None

    def start(self, tls_files: tuple[Path, Path]) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls_files)
        server = self

        class Handler:
            async def handle_DATA(self, smtp: Any, session: Any, envelope: Any) -> str:
                server.messages.append(message_from_bytes(envelope.content, policy=policy.default))  # type: ignore[arg-type]
                server.recipients.append(list(envelope.rcpt_tos))
                server.tls_seen.append(smtp.transport.get_extra_info("ssl_object") is not None)
                return "250 OK"

        def authenticate(smtp: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
            login, password = data.login.decode(), data.password.decode()
            server.logins.append((mechanism, login))
            return AuthResult(success=(login, password) == (SMTP_USER, SMTP_PASSWORD), handled=False)

        kwargs: dict[str, Any] = dict(authenticator=authenticate, auth_required=True)
        if self.mode == "starttls":
            kwargs.update(tls_context=context, require_starttls=True)
        else:
            # Implicit TLS: aiosmtpd cannot see the socket's TLS, so its AUTH-needs-TLS check is lifted;
            # the handler still records that the session was TLS.
            kwargs.update(ssl_context=context, auth_require_tls=False)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Requiring AUTH while not requiring TLS")
            self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, **kwargs)
            self.controller.start()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None


@pytest.fixture
def smtp_server(tls_files: tuple[Path, Path]) -> Iterator[SmtpServer]:
    server = SmtpServer(free_port(), "starttls")
    server.start(tls_files)
    yield server
    server.stop()


@dataclass
class SlackServer:
    """Webhook at /hooks/T/B/X; Web API at /api/<method>; file uploads at /upload/<id>.

    ``script[path]`` is a list of (status, headers) answered, in order, before the normal reply.
    """

    port: int = 0
    requests: list[tuple[float, str, dict[str, Any], bytes]] = field(default_factory=list)
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    httpd: ThreadingHTTPServer | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def webhook_url(self) -> str:
        return f"{self.base}/hooks/T000/B000/XXXX"

    def calls(self, path: str) -> list[tuple[float, dict[str, Any], bytes]]:
        return [(at, body, raw) for at, p, body, raw in self.requests if p == path]


@pytest.fixture
def slack_server() -> Iterator[SlackServer]:
    import time

    state = SlackServer()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            kind = self.headers.get("Content-Type", "")
            if "json" in kind:
                body: dict[str, Any] = json.loads(raw or b"{}")
            elif "form" in kind and self.path.startswith("/api/"):
                body = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            else:
                body = {}
            body["_auth"] = self.headers.get("Authorization")
            state.requests.append((time.monotonic(), self.path, body, raw))
            scripted = state.script.get(self.path)
            if scripted:
                status, headers = scripted.pop(0)
                self._reply(status, {"ok": False, "error": "ratelimited" if status == 429 else "fatal_error"},
                            headers, text=self.path.startswith("/hooks/"))
                return
            if self.path.startswith("/hooks/"):
                self._reply(200, "ok", text=True)
            elif self.path == "/api/chat.postMessage":
                self._reply(200, {"ok": True, "channel": "C0REPORTS", "ts": "1700000000.000100"})
            elif self.path == "/api/files.getUploadURLExternal":
                self._reply(200, {"ok": True, "file_id": "F0CHART", "upload_url": f"{state.base}/upload/F0CHART"})
            elif self.path.startswith("/upload/"):
                self._reply(200, "OK - 1234", text=True)
            elif self.path == "/api/files.completeUploadExternal":
                self._reply(200, {"ok": True, "files": [{"id": "F0CHART", "title": "chart"}]})
            else:
                self._reply(404, {"ok": False, "error": "unknown_method"})

        def _reply(self, status: int, payload: Any, headers: dict[str, str] | None = None,
                   text: bool = False) -> None:
            if isinstance(payload, str):
                data = payload.encode()
            elif text:  # the webhook answers errors as plain text, e.g. "invalid_blocks"
                data = str(payload["error"]).encode()
            else:
                data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.httpd, state.port = httpd, httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
