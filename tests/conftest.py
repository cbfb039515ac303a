"""Shared fixtures: a fresh broker home per test, and the store on SQLite and on real PostgreSQL."""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.leftovers import SESSION_MARK, reap_leftovers

if TYPE_CHECKING:
    from tests.skystandin.server import SkyStandIn

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "traces"
POSTGRES_ADMIN_URL = os.environ.get("BROKER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def pytest_configure(config: pytest.Config) -> None:
    # Set once by the controlling process; xdist's workers and every process a test starts inherit it.
    os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, each worker's share starts with its part of the slow tests.

    The suite mostly waits on processes it started, and worksteal first hands each worker a contiguous
    run of the collection and later steals from the end of the longest queue: ordered as collected, a
    minutes-long test could start last and hold the run open alone. Interleaved so, every worker begins
    with slow tests and the run ends on short ones, whichever worker steals them.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    fast = [item for item in items if not item.get_closest_marker("slow")]
    items[:] = [item for share in range(workers) for item in (*slow[share::workers], *fast[share::workers])]


@pytest.hookimpl(trylast=True)  # after xdist has stopped its workers
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test left a process behind (checked once, by the controlling process)."""
    if hasattr(session.config, "workerinput"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    temp_root = str(factory.getbasetemp()) if factory is not None else "\0no temp root"
    left = reap_leftovers(os.environ[SESSION_MARK], temp_root)
    if left:
        lines = "\n".join(f"  pid {pid}: {command}" for pid, command in sorted(left.items()))
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"the tests left {len(left)} process(es) running (now killed):\n{lines}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def broker_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own empty broker home and no stray settings from the environment.

    Afterwards, local clusters the test left up are torn down the way the local cloud takes a
    request for it (a ``terminate`` file): like a real cloud, the local backend keeps a cluster
    running after the broker that launched it has gone, and a test that stops at its assertion
    (a pooled cluster, a job still running) would leave that cluster's process behind.
    """
    home = tmp_path / "broker-home"
    for name in list(os.environ):
        if name.startswith("BROKER_") and name != "BROKER_TEST_POSTGRES":
            monkeypatch.delenv(name)
    monkeypatch.setenv("BROKER_HOME", str(home))
    yield home
    for cluster in (home / "local" / "clusters").glob("*/"):
        (cluster / "terminate").touch()


def _postgres_available() -> str | None:
    import psycopg

    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=3):
            return None
    except Exception as exc:
        return str(exc)


@pytest.fixture(scope="session")
def postgres_server() -> str:
    problem = _postgres_available()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL unreachable under CI=true: {problem}")
        pytest.skip(f"PostgreSQL unreachable: {problem}")
    return POSTGRES_ADMIN_URL


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    import psycopg

    name = f"broker_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = postgres_server.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def shared_traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip("the shared real traces are not beside the project")
    return TRACES


@pytest.fixture
def skypilot(tmp_path: Path) -> Iterator[SkyStandIn]:
    """SkyPilot's API server and clouds, played in this process by ``tests/skystandin`` with nodes that
    run nothing (a job runs until the test ends it); give the provisioner ``skypilot.sdk()``."""
    from tests.skystandin.server import SkyStandIn

    with SkyStandIn(tmp_path / "skypilot", launch_seconds=0.05, run_commands=False) as standin:
        yield standin


@pytest.fixture
def engine_held(broker_home: Path) -> Iterator[Path]:
    """The test holds the home's engine lock, as a running engine would: `status` starts none for the
    made-up jobs the test stored."""
    broker_home.mkdir(parents=True, exist_ok=True)
    with open(broker_home / "engine.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield broker_home
