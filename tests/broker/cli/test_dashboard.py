"""`broker dashboard`: the dashboard on the embedded store, signed in with the token it prints and revokes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from broker.cli.dashboard import TOKEN_LIFETIME
from broker.store import open_store
from broker.store.tables import ApiTokenRow
from broker.tokens import team_of_token, token_digest
from tests.broker.service.replicas import ROOT, free_port, wait_for


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_dashboard_prints_a_token_that_signs_in_and_is_revoked_when_it_stops(broker_home: Path,
                                                                             stop: signal.Signals) -> None:
    port = free_port()
    env = {**os.environ, "BROKER_HOME": str(broker_home)}
    process = subprocess.Popen([sys.executable, "-m", "broker", "dashboard", "--port", str(port)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        token = process.stdout.readline().strip()
        assert token.startswith("bkr_")
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(url), 60, "the dashboard to serve")
        with httpx.Client(base_url=url) as client:
            assert client.post("/login", data={"token": "bkr_wrong"}).status_code == 401
            signed = client.post("/login", data={"token": token})
            assert signed.status_code == 303 and "admin (all teams)" in client.get("/jobs").text
    finally:
        process.send_signal(stop)
        process.wait(timeout=30)
    store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
    try:
        assert team_of_token(store, token) is None  # revoked on the way out
        with store.transaction() as s:
            [row] = s.scalars(select(ApiTokenRow))
        assert row.revoked_at is not None
    finally:
        store.dispose()


@pytest.mark.slow
def test_a_killed_dashboard_leaves_a_token_that_expires_on_its_own(broker_home: Path) -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "broker", "dashboard", "--port", str(port)], cwd=ROOT,
                               env={**os.environ, "BROKER_HOME": str(broker_home)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        token = process.stdout.readline().strip()
    finally:
        process.kill()
        process.wait(timeout=30)
    store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
    try:
        with store.transaction() as s:
            [row] = s.scalars(select(ApiTokenRow).where(ApiTokenRow.token_hash == token_digest(token)))
        assert row.revoked_at is None and row.expires_at is not None  # SIGKILL: nothing ran on the way out
        assert row.expires_at - datetime.now(UTC) <= TOKEN_LIFETIME
    finally:
        store.dispose()


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/login", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_dashboard_refuses_a_port_out_of_range(broker_home: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "broker", "dashboard", "--port", "70000"], cwd=ROOT,
                          env={**os.environ, "BROKER_HOME": str(broker_home)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "--port" in done.stderr and "Traceback" not in done.stderr
