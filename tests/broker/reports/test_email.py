from __future__ import annotations

import io
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from sqlalchemy import func, select

from broker.config.settings import Settings, load_settings
from broker.reports.build import Window, build_report
from broker.reports.deliver import deliver, send
from broker.reports.render import money
from broker.store import Store
from broker.store.deliveries import ReportDeliveryRow
from broker.store.tables import LedgerRow
from tests.broker.reports.conftest import SMTP_PASSWORD, SMTP_USER, SmtpServer, free_port
from tests.broker.reports.ledger import DEMO_START, LedgerWriter

WINDOW = Window(DEMO_START, DEMO_START + timedelta(days=4))


def smtp_settings(port: int, cert: Path, tls: str = "starttls", password: str = SMTP_PASSWORD,
                  **extra: Any) -> Settings:
    return load_settings(smtp_host="127.0.0.1", smtp_port=port, smtp_tls=tls, smtp_user=SMTP_USER,
                         smtp_password=password, smtp_from="broker@example.com", smtp_ca_file=cert,
                         delivery_backoff_s=0.01, **extra)


def test_report_email_over_starttls_with_login(sqlite_demo: tuple[Store, LedgerWriter], smtp_server: SmtpServer,
                                               tls_files: tuple[Path, Path]) -> None:
    store, _ = sqlite_demo
    report = build_report(store, WINDOW)
    results = deliver(store, smtp_settings(smtp_server.port, tls_files[0]), report,
                      email=["ops@example.com", "lead@example.com"], slack=False)

    assert [(r.channel, r.status, r.attempts) for r in results] == [("email", "sent", 1)]
    assert smtp_server.logins and smtp_server.logins[0][1] == SMTP_USER
    assert smtp_server.tls_seen == [True]
    assert smtp_server.recipients == [["ops@example.com", "lead@example.com"]]
    message = smtp_server.messages[0]
    assert message.get_content_type() == "multipart/alternative"
    text = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    assert text is not None and html is not None
    html_source = html.get_content() if html.get_content_type() == "text/html" else \
        next(p for p in html.iter_parts() if p.get_content_type() == "text/html").get_content()
    # The chart travels inline and the HTML points at it by Content-ID.
    images = [p for p in message.walk() if p.get_content_type() == "image/png"]
    assert len(images) == 1
    cid = images[0]["Content-ID"].strip("<>")
    assert f'src="cid:{cid}"' in html_source
    png = Image.open(io.BytesIO(images[0].get_payload(decode=True)))
    png.verify()
    assert png.format == "PNG" and png.size[0] >= 600

    # The figures in both parts are the ledger's.
    with store.transaction() as s:
        spend, on_demand = s.execute(select(func.sum(LedgerRow.cost), func.sum(LedgerRow.on_demand_cost))).one()
    plain = text.get_content()
    for part in (plain, html_source):
        assert money(spend) in part and money(on_demand) in part
        assert money(on_demand - spend) in part
    assert money(spend) in message["Subject"]
    assert re.search(r"c-az-1 .*unallocated", plain)


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
def test_report_email_over_implicit_ssl(sqlite_demo: tuple[Store, LedgerWriter],
                                        tls_files: tuple[Path, Path]) -> None:
    store, _ = sqlite_demo
    server = SmtpServer(free_port(), "ssl")
    server.start(tls_files)
    try:
        results = deliver(store, smtp_settings(server.port, tls_files[0], tls="ssl"), build_report(store, WINDOW),
                          email=["ops@example.com"], slack=False)
    finally:
        server.stop()
    assert results[0].status == "sent", results[0].error
    assert server.tls_seen == [True] and len(server.messages) == 1


def test_untrusted_certificate_fails_without_retrying(sqlite_demo: tuple[Store, LedgerWriter],
                                                      smtp_server: SmtpServer, tls_files: tuple[Path, Path]) -> None:
    store, _ = sqlite_demo
    settings = load_settings(smtp_host="127.0.0.1", smtp_port=smtp_server.port, smtp_from="broker@example.com",
                             smtp_user=SMTP_USER, smtp_password=SMTP_PASSWORD, delivery_backoff_s=0.01)
    [result] = deliver(store, settings, build_report(store, WINDOW), email=["ops@example.com"], slack=False)
    assert result.status == "failed" and result.attempts == 1
    assert "certificate" in (result.error or "")
    assert smtp_server.messages == []


def test_wrong_password_is_a_permanent_failure(sqlite_demo: tuple[Store, LedgerWriter], smtp_server: SmtpServer,
                                               tls_files: tuple[Path, Path]) -> None:
    store, _ = sqlite_demo
    settings = smtp_settings(smtp_server.port, tls_files[0], password="wrong-pw")
    [result] = deliver(store, settings, build_report(store, WINDOW), email=["ops@example.com"], slack=False)
    assert result.status == "failed" and result.attempts == 1
    assert "refused" in (result.error or "") and "wrong-pw" not in (result.error or "")
    assert smtp_server.messages == []


def test_smtp_down_keeps_the_report_and_resend_delivers_it(sqlite_demo: tuple[Store, LedgerWriter],
                                                           tls_files: tuple[Path, Path]) -> None:
    store, _ = sqlite_demo
    port = free_port()  # nothing listens here yet
    settings = smtp_settings(port, tls_files[0], delivery_attempts=3)
    report = build_report(store, WINDOW)
    [failed] = deliver(store, settings, report, email=["ops@example.com"], slack=False)
    assert failed.status == "failed" and failed.attempts == 3
    with store.transaction() as s:
        row = s.get(ReportDeliveryRow, failed.id)
        assert row is not None and row.status == "failed" and row.last_error and row.sent_at is None
        assert row.payload["report"]["totals"]["spend"] == pytest.approx(report.totals.spend)

    server = SmtpServer(port, "starttls")
    server.start(tls_files)
    try:
        resent = send(store, settings, failed.id)
    finally:
        server.stop()
    assert resent.status == "sent" and resent.attempts == 4
    assert money(report.totals.spend) in server.messages[0]["Subject"]
    with store.transaction() as s:
        row = s.get(ReportDeliveryRow, failed.id)
        assert row is not None and row.status == "sent" and row.sent_at is not None and row.last_error is None
