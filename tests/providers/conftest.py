"""Fixtures for the cloud pollers: a moto server for the EC2 catalog and AWS credentials for tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from providers.fetching import Backoff

# This machine is not a GCE VM: spare each GCP poll google-auth's 3 s metadata-server probe.
os.environ.setdefault("NO_GCE_CHECK", "true")

FAST = Backoff(attempts=4, base_seconds=0.01, max_seconds=0.05)


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    from tests.fakeclouds.market import quiet_moto

    quiet_moto()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """Static test keys, and nothing from the machine's own AWS configuration."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
