"""``/docs``: the API reference is served, whole, from the app's own schema, with nothing loaded from elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.clock import WallClock
from broker.intake import Intake
from broker.store import open_store


def _client(tmp_path: Path, intake: bool) -> TestClient:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    return TestClient(create_app(store, WallClock(), Intake(tmp_path / "home", "local", None) if intake else None))


def test_docs_show_every_operation_of_the_schema_with_no_script_and_no_outside_url(tmp_path: Path) -> None:
    client = _client(tmp_path, intake=True)
    schema = client.get("/openapi.json").json()
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    operations = [(method, path) for path, item in schema["paths"].items() for method in item]
    assert ("post", "/v1/jobs") in operations and ("get", "/v1/reports") in operations
    for method, path in operations:
        assert re.search(rf'<span class="method">{method}</span><code>{re.escape(path)}</code>', page.text), path
    for name in schema["components"]["schemas"]:
        assert f'id="schema-{name}"' in page.text
    assert "<script" not in page.text
    assert not re.findall(r'(?:src|href)="(?:https?:)?//', page.text)  # no CDN, no other host


def test_the_embedded_brokers_notice_api_has_its_docs_too(tmp_path: Path) -> None:
    client = _client(tmp_path, intake=False)
    page = client.get("/docs")
    assert page.status_code == 200
    assert "/v1/notices" in page.text and "/v1/jobs" not in page.text
