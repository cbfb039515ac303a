"""``broker prices`` shows every cloud's capacity signal, read straight from the price book."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.cli import main
from broker.market.book import PriceBook
from broker.store import open_store
from providers.base import SpotQuote


def test_table_and_json_show_gcp_and_azure_signals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("BROKER_DB_URL", url)
    store = open_store(url)
    now = datetime.now(UTC)
    gcp = SpotQuote("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", "H100", 8, 20.0, 88.0, now)
    nd = SpotQuote("azure", "eastus", "eastus-1", "Standard_ND96isr_H100_v5", "H100", 8, 25.0, 98.0, now)
    book = PriceBook(store)
    book.record("gcp", [replace(gcp, obtainability=0.9, estimated_uptime_s=7200.0, preemption_rate=0.2)], at=now)
    book.record("azure", [replace(nd, placement_level="Low")], at=now)
    store.dispose()

    main(["prices", "--json"])
    quotes = {q["cloud"]: q for q in json.loads(capsys.readouterr().out)["quotes"]}
    assert (quotes["gcp"]["obtainability"], quotes["gcp"]["estimated_uptime_s"]) == (0.9, 7200.0)
    assert quotes["gcp"]["preemption_rate"] == 0.2
    assert quotes["azure"]["placement_level"] == "Low" and quotes["azure"]["obtainability"] is None

    from broker.cli.app import console

    monkeypatch.setattr(console, "width", 160)
    main(["prices"])
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert " 9.1/10 " in rows["gcp"] and " 2/10 " in rows["azure"]
