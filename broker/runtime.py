"""Putting a broker together: ``assemble`` builds store, clock, market, provisioner and agent tokens for
a backend, and ``Runtime.engine`` the engine over them; the embedded CLI broker, the SkyPilot broker
and ``broker serve`` all start from it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import select

from broker.api.app import BackgroundServer, create_app
from broker.backends.base import Provisioner
from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.clock import Clock, WallClock
from broker.config.settings import Settings
from broker.engine import Engine, engine_options
from broker.market.book import Market
from broker.model import ACTIVE_STATES
from broker.spec.job import JobSpec, job_spec_from_data
from broker.store import Store, open_store
from broker.store.private import private_directory
from broker.store.tables import ClusterRow, JobRow
from broker.tokens import SharedAgentTokens
from providers.local import LocalMarket

if TYPE_CHECKING:
    from broker.backends.skypilot.provisioner import SkyPilotOptions
    from broker.backends.skypilot.runtime import SkyPilotBroker

BUNDLED_MARKET = Path(__file__).parent / "data" / "quickstart-market.csv"


class EngineLock:
    """One engine drives a broker home at a time; others only watch the store."""

    def __init__(self, home: Path) -> None:
        private_directory(home)
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
        handle.truncate(0)  # the holder's pid, for whoever finds the lock taken
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return True

    def holder(self) -> int | None:
        """The pid of the process that last held the lock (it may have ended)."""
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

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


@dataclass
class Runtime:
    """The parts of one running broker: built by ``assemble``, whichever front end drives them."""

    settings: Settings
    store: Store
    clock: Clock
    market: Market
    provisioner: Provisioner
    # Kept in the store, so every replica derives the same agent tokens.
    tokens: SharedAgentTokens
    world: LocalWorld | None = None  # the local replay, on the local backend

    def engine(self, broker_url: str | None, store: Store | None = None, provisioner: Provisioner | None = None,
               **extra: Any) -> Engine:
        """The engine over these parts; ``broker_url`` is where node agents report. A leader passes
        its fenced store and provisioner, so a stale leader can neither write nor call a cloud."""
        return Engine(store or self.store, self.clock, self.market, provisioner or self.provisioner,
                      engine_options(self.settings, broker_url, **extra), tokens=self.tokens)


def embedded_world(settings: Settings, store: Store, fresh: bool) -> LocalWorld:
    """The local replay of a one-process broker: kept while jobs are active or unless ``fresh``."""
    existing = LocalWorld.load(settings.home)
    trace = str(settings.market or BUNDLED_MARKET)
    busy = active_job_count(store) > 0
    if existing is not None and (busy or not fresh):
        return existing
    return LocalWorld.begin(settings.home, trace, settings.speed)


def assemble(settings: Settings, store: Store | None = None,
             world: Callable[[Store], LocalWorld] | None = None, sdk: Any = None, catalog: Any = None) -> Runtime:
    """The one way to put a broker together for ``settings.backend``.

    On the local backend, ``world`` picks the market replay (default: ``embedded_world``, kept
    unless fresh): the local clusters and their market are one stand-in cloud. On SkyPilot the
    market is the price book, with SkyPilot's catalog only for offers it never quoted; ``sdk`` and
    ``catalog`` stand in for SkyPilot's own in tests.
    """
    private_directory(settings.home)
    store = store or open_store(settings.database_url)
    tokens = SharedAgentTokens(store, settings.home)
    if settings.backend == "skypilot":
        from broker.backends.skypilot.provisioner import SkyPilotProvisioner
        from broker.market.book import PriceBook
        from broker.market.price_market import PriceBookMarket
        from broker.market.sky_catalog import SkyCatalogMarket

        if sdk is None and settings.skypilot_sdk is not None:
            from broker.service.hooks import find

            sdk = find(settings.skypilot_sdk, "skypilot_sdk")
        market = PriceBookMarket(PriceBook(store), SkyCatalogMarket(lambda: (), catalog=catalog),
                                 settings.price_stale_seconds, wanted=lambda: active_accelerators(store))
        provisioner = SkyPilotProvisioner(settings.home, store_specs(store), skypilot_options(settings), sdk=sdk)
        return Runtime(settings, store, WallClock(), market, provisioner, tokens)
    local = world(store) if world is not None else embedded_world(settings, store, fresh=False)
    return Runtime(settings, store, local.clock, local.market(),
                   LocalProvisioner(settings.home, local, settings.local_provision_seconds), tokens, local)


def store_specs(store: Store) -> Callable[[str], JobSpec | None]:
    """cluster id -> the spec of the job it was launched for (read from the store, then cached)."""
    cache: dict[str, JobSpec] = {}

    def lookup(cluster_id: str) -> JobSpec | None:
        if cluster_id not in cache:
            with store.transaction() as s:
                job = s.scalar(select(JobRow).join(ClusterRow, ClusterRow.job_id == JobRow.id)
                               .where(ClusterRow.id == cluster_id))
                if job is None:
                    return None
                cache[cluster_id] = job_spec_from_data(job.spec, source=job.spec_path or job.name, offline=True)
        return cache[cluster_id]

    return lookup


def active_accelerators(store: Store) -> set[str]:
    with store.transaction() as s:
        return {a for a in s.scalars(select(JobRow.accelerator).where(JobRow.state.in_(ACTIVE_STATES))) if a}


def skypilot_options(settings: Settings) -> SkyPilotOptions:
    from broker.backends.skypilot.provisioner import SkyPilotOptions

    return SkyPilotOptions(prefix=settings.skypilot_prefix, launch_timeout_s=settings.skypilot_launch_timeout,
                           refresh_s=settings.skypilot_refresh_seconds,
                           idle_minutes_to_autostop=settings.skypilot_autostop_minutes)


class EmbeddedBroker:
    """The whole broker in one process, on the local backend."""

    def __init__(self, settings: Settings, store: Store | None = None, fresh_market: bool = False) -> None:
        self.settings = settings
        self.home = settings.home
        self.runtime = assemble(settings, store, world=lambda store: embedded_world(settings, store, fresh_market))
        self.store = self.runtime.store
        assert self.runtime.world is not None and isinstance(self.runtime.market, LocalMarket)
        self.world = self.runtime.world
        self.market = self.runtime.market
        self.clock = self.runtime.clock
        self.provisioner = self.runtime.provisioner
        self.tokens = self.runtime.tokens
        self.server: BackgroundServer | None = None
        self.engine: Engine | None = None

    def start(self) -> Engine:
        """Serve the notice API and build the engine (call only while holding the engine lock)."""
        self.server = BackgroundServer(create_app(self.store, self.clock)).start()
        self.engine = self.runtime.engine(self.server.url)
        return self.engine

    def close(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
        self.store.dispose()


def open_broker(settings: Settings, fresh_market: bool = False) -> EmbeddedBroker | SkyPilotBroker:
    """The broker for ``settings.backend``: the embedded local one, or real clusters through SkyPilot."""
    if settings.backend == "skypilot":
        from broker.backends.skypilot.runtime import SkyPilotBroker

        return SkyPilotBroker(assemble(settings))
    return EmbeddedBroker(settings, fresh_market=fresh_market)
