from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.cli import main
from broker.store import Store, open_store
from broker.store.deliveries import ReportDeliveryRow
from tests.broker.reports.conftest import SMTP_PASSWORD, SMTP_USER, SmtpServer, free_port
from tests.broker.reports.conftest import tls_files as tls_files  # the fixture, shared
from tests.broker.reports.ledger import LedgerWriter, demo_ledger

WINDOW = ["--from", "2026-03-02", "--to", "2026-03-06"]


@pytest.fixture
def cli_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Store, LedgerWriter]]:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("BROKER_DB_URL", url)
    store = open_store(url)
    yield store, demo_ledger(store)
    store.dispose()


def run(args: list[str]) -> int:
    try:
        main(["report", *args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_json_and_csv_carry_the_ledger_totals(cli_store: tuple[Store, LedgerWriter],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _, writer = cli_store
    spend = sum(r["cost"] for r in writer.rows)
    assert run([*WINDOW, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["totals"]["spend"] == pytest.approx(spend)
    assert {g["key"] for g in data["groups"]["team"]} == {"nlp", "vision"}

    assert run([*WINDOW, "--format", "csv", "--team", "nlp"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[0]["group"] == "total"
    nlp = sum(r["cost"] for r in writer.rows if r["cluster_id"] in {"c-aws-1", "c-gcp-1", "c-aws-2"})
    assert float(rows[0]["spend"]) == pytest.approx(nlp, abs=1e-3)
    assert {r["key"] for r in rows if r["group"] == "team"} == {"nlp"}


def test_table_and_html(cli_store: tuple[Store, LedgerWriter], capsys: pytest.CaptureFixture[str]) -> None:
    _, writer = cli_store
    spend = f"${sum(r['cost'] for r in writer.rows):,.2f}"
    assert run(WINDOW) == 0
    table = capsys.readouterr().out
    assert spend in table and "Idle GPU-hours by cause" in table and "Largest wastes" in table
    assert run([*WINDOW, "--format", "html"]) == 0
    html = capsys.readouterr().out
    assert html.startswith("<div") and spend in html and "cid:" not in html


@pytest.mark.parametrize(("args", "message"), [
    (["--since", "soon"], "--since"),
    (["--format", "xml"], "--format"),
    (["--email", "ops"], "--email"),
    (["--email", "ops@example.com"], "BROKER_SMTP_HOST"),
    (["--slack"], "BROKER_SLACK_WEBHOOK_URL"),
    (["--resend", "99"], "no report delivery with id 99"),
    (["--resend", "one"], "--resend"),
])
def test_bad_input_exits_2_and_records_nothing(cli_store: tuple[Store, LedgerWriter], args: list[str],
                                               message: str, capsys: pytest.CaptureFixture[str]) -> None:
    store, _ = cli_store
    assert run(args) == 2
    assert message in capsys.readouterr().err.replace("\n", " ")
    with store.transaction() as s:
        assert s.scalars(select(ReportDeliveryRow)).all() == []


def test_email_failure_exits_1_and_resend_delivers(cli_store: tuple[Store, LedgerWriter],
                                                   tls_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    store, _ = cli_store
    port = free_port()
    for name, value in {"SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(port), "SMTP_USER": SMTP_USER,
                        "SMTP_PASSWORD": SMTP_PASSWORD, "SMTP_FROM": "broker@example.com",
                        "SMTP_CA_FILE": str(tls_files[0]), "DELIVERY_ATTEMPTS": "2",
                        "DELIVERY_BACKOFF_S": "0.01"}.items():
        monkeypatch.setenv(f"BROKER_{name}", value)
    assert run([*WINDOW, "--format", "json", "--email", "ops@example.com"]) == 1
    err = capsys.readouterr().err
    assert "failed email to ops@example.com (delivery 1, 2 attempt(s))" in err
    assert "broker report --resend 1" in err and SMTP_PASSWORD not in err

    server = SmtpServer(port, "starttls")
    server.start(tls_files)
    try:
        assert run(["--resend", "1"]) == 0
    finally:
        server.stop()
    assert "sent email to ops@example.com (delivery 1)" in capsys.readouterr().err
    assert len(server.messages) == 1
    with store.transaction() as s:
        row = s.get(ReportDeliveryRow, 1)
        assert row is not None and row.status == "sent" and row.attempts == 3
