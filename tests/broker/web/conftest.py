"""A dashboard served for real on a loopback port, and headless Chromium (Debian's) driven by Playwright."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.api.app import BackgroundServer, create_app
from broker.clock import WallClock
from broker.intake import Intake
from broker.store import Store, open_store
from broker.tokens import create_api_token
from tests.broker.web.seed import seed_fleet

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
# A test run leaves the checkout as it found it; BROKER_SCREENSHOT_DIR=docs/screenshots refreshes the README's.
SCREENSHOTS = Path(os.environ.get("BROKER_SCREENSHOT_DIR") or Path(tempfile.gettempdir()) / "broker-screenshots")


@dataclass
class Dashboard:
    store: Store
    home: Path
    url: str
    client: TestClient
    tokens: dict[str, str]  # team -> API token (alpha, beta, admin)
    jobs: dict[str, str] = field(default_factory=dict)

    def signed_in(self, team: str) -> TestClient:
        client = TestClient(self.client.app)
        response = client.post("/login", data={"token": self.tokens[team]}, follow_redirects=False)
        assert response.status_code == 303, response.text
        return client


@pytest.fixture
def dashboard(db_url: str, broker_home: Path) -> Iterator[Dashboard]:
    store = open_store(db_url)
    app = create_app(store, WallClock(), Intake(broker_home, "local", None))
    tokens = {team: create_api_token(store, team).token for team in ("alpha", "beta", "admin")}
    jobs = seed_fleet(store)
    server = BackgroundServer(app).start()
    deadline = time.monotonic() + 60
    while not server.server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.server.started, "the dashboard server did not start"
    try:
        yield Dashboard(store, broker_home, server.url, TestClient(app), tokens, jobs)
    finally:
        server.stop()
        store.dispose()


# Per module, not per session: the Playwright driver is closed right after the browser tests that use it,
# rather than at the session's end (one CI run hung there, closing a driver that had died meanwhile).
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: scripts/test.sh installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium chromium-driver)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Tab:
    """A browser tab that records console errors and failed requests."""

    def __init__(self, browser: Any, base: str) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def goto(self, path: str) -> Any:
        return self.page.goto(self.base + path)

    def sign_in(self, token: str) -> None:
        self.goto("/login")
        self.page.fill("input[name=token]", token)
        self.page.click("button[type=submit]")
        self.page.wait_for_load_state()

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(chromium: Any, dashboard: Dashboard) -> Iterator[Tab]:
    opened = Tab(chromium, dashboard.url)
    try:
        yield opened
    finally:
        opened.close()


