"""Wiring the embedded broker together: store, clock, market, provisioner, notice API, engine."""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import IO, TYPE_CHECKING

from sqlalchemy import select

from broker.api.app import BackgroundServer, create_app
from broker.clock import Clock, WallClock
from broker.config import Settings
from broker.engine import Engine, engine_options
from broker.model import ACTIVE_STATES
from broker.provision.local import LocalProvisioner, LocalWorld
from broker.store import Store, open_store
from broker.store.tables import JobRow
from broker.tokens import SharedAgentTokens

if TYPE_CHECKING:
    from broker.runtime_skypilot import SkyPilotBroker

BUNDLED_MARKET = Path(__file__).parent / "data" / "quickstart-market.csv"


class EngineLock:
    """One engine drives a broker home at a time; others only watch the store."""

    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.path = home / "engine.lock"
        self._handle: IO[str] | None = None

    def acquire(self) -> bool:
        handle = open(self.path, "a")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._handle = handle
        return True

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def broker_clock(settings: Settings) -> Clock:
    """The clock the broker of ``settings`` keeps: the local replay's, or the wall clock."""
    world = LocalWorld.load(settings.home) if settings.backend == "local" else None
    return world.clock if world is not None else WallClock()


def active_job_count(store: Store) -> int:
    with store.transaction() as s:
        return len(list(s.scalars(select(JobRow.id).where(JobRow.state.in_(ACTIVE_STATES)))))


class EmbeddedBroker:
    """The whole broker in one process, on the local backend."""

    def __init__(self, settings: Settings, store: Store | None = None, fresh_market: bool = False) -> None:
        self.settings = settings
        self.home = settings.home
        self.store = store or open_store(settings.database_url)
        self.world = self._world(fresh_market)
        self.market = self.world.market()
        self.clock = self.world.clock
        self.provisioner = LocalProvisioner(self.home, self.world, settings.local_provision_seconds)
        self.server: BackgroundServer | None = None
        self.engine: Engine | None = None
        # Kept in the store, so every `broker serve` replica derives the same agent tokens.
        self.tokens = SharedAgentTokens(self.store, self.home)

    def _world(self, fresh: bool) -> LocalWorld:
        existing = LocalWorld.load(self.home)
        trace = str(self.settings.market or BUNDLED_MARKET)
        busy = active_job_count(self.store) > 0
        if existing is not None and (busy or not fresh):
            return existing
        return LocalWorld.begin(self.home, trace, self.settings.speed)

    def start(self) -> Engine:
        """Serve the notice API and build the engine (call only while holding the engine lock)."""
        self.server = BackgroundServer(create_app(self.store, self.clock)).start()
        self.engine = Engine(self.store, self.clock, self.market, self.provisioner,
                             engine_options(self.settings, self.server.url), tokens=self.tokens)
        return self.engine

    def close(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
        self.store.dispose()


def open_broker(settings: Settings, fresh_market: bool = False) -> EmbeddedBroker | SkyPilotBroker:
    """The broker for ``settings.backend``: the embedded local one, or real clusters through SkyPilot."""
    if settings.backend == "skypilot":
        from broker.runtime_skypilot import SkyPilotBroker

        return SkyPilotBroker(settings)
    return EmbeddedBroker(settings, fresh_market=fresh_market)
