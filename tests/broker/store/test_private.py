"""The broker home, the SQLite store (it holds the agent-token key) and job logs are this user's only."""

from __future__ import annotations

from pathlib import Path

from broker.runtime import EngineLock
from broker.store import open_store
from broker.store.private import private_opener


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_new_store_and_its_home_are_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = open_store(f"sqlite:///{home}/broker.db")
    try:
        assert _mode(home) == 0o700
        assert _mode(home / "broker.db") == 0o600
        side_files = [path for path in home.iterdir() if path.name.startswith("broker.db-")]
        assert all(_mode(path) == 0o600 for path in side_files), side_files
    finally:
        store.dispose()


def test_a_home_and_store_made_readable_by_an_older_version_are_tightened(tmp_path: Path) -> None:
    home = tmp_path / "home"
    open_store(f"sqlite:///{home}/broker.db").dispose()
    home.chmod(0o755)
    (home / "broker.db").chmod(0o644)
    open_store(f"sqlite:///{home}/broker.db").dispose()
    assert _mode(home / "broker.db") == 0o600
    EngineLock(home)
    assert _mode(home) == 0o700


def test_a_store_in_a_shared_directory_leaves_the_directory_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    open_store(f"sqlite:///{shared}/broker.db").dispose()
    assert _mode(shared) == 0o755
    assert _mode(shared / "broker.db") == 0o600


def test_logs_are_created_private(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1-node-0.log"
    with open(log, "ab", opener=private_opener) as handle:
        handle.write(b"x")
    assert _mode(log) == 0o600
