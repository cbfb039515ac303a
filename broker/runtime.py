"""Putting a broker together: ``assemble`` builds store, clock, market, provisioner and agent tokens
for the settings' backend, and the ``Runtime`` it returns is what every front end drives: ``broker
launch``/``broker engine`` (``start``, then the engine's steps), ``broker serve`` (``engine`` under
the leader's fence) and the tests.

Each backend builds its own parts in its package (``broker.backends.local.runtime``,
``broker.backends.skypilot.runtime``); this module only picks one. The notice API an embedded
engine serves is imported by ``start``, so a command that only assembles never imports FastAPI.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from broker.backends.base import Provisioner
from broker.backends.local.provisioner import LocalWorld
from broker.clock import Clock, WallClock
from broker.config.settings import Settings
from broker.config.teams import budget_refusal
from broker.engine import Engine, engine_options
from broker.intake import Intake, NodeKind, submit
from broker.market.book import Market
from broker.spec.job import JobSpec, Pipeline
from broker.store import Store, open_store
from broker.store.private import private_directory
from broker.tokens import SharedAgentTokens


class EngineLock:
    """One engine drives a broker home at a time; others only watch the store."""

    def __init__(self, home: Path) -> None:
        private_directory(home)
        self.path = home / "engine.lock"
        self._handle: IO[str] | None = None

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Take the lock, trying for up to ``wait_s`` seconds; False when another process holds it."""
        deadline = time.monotonic() + wait_s
        while True:
            handle = open(self.path, "a")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                handle.close()
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)
        self._handle = handle
        self._write(os.getpid())
        return True

    def _write(self, pid: int) -> None:
        assert self._handle is not None
        self._handle.truncate(0)  # the holder's pid, for whoever finds the lock taken
        self._handle.write(f"{pid}\n")
        self._handle.flush()

    def hand_over(self, pid: int) -> None:
        """Name ``pid`` (an engine just started, about to take the lock) as the holder, while still holding it."""
        self._write(pid)

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


class Stoppable(Protocol):
    def stop(self) -> None: ...


class Backend(Protocol):
    """What one backend brings (``LocalBackend``, ``SkyPilotBackend``): its clock, market and
    provisioner, and what differs in serving and tidying up around the engine."""

    @property
    def clock(self) -> Clock: ...
    @property
    def market(self) -> Market: ...
    @property
    def provisioner(self) -> Provisioner: ...
    @property
    def world(self) -> LocalWorld | None: ...

    def offered(self) -> frozenset[NodeKind] | None:
        """(accelerator, GPUs per node) the market offers; None when a job file's catalog check is enough."""

    def api_address(self, settings: Settings) -> tuple[str, int]:
        """Where an embedded engine's notice API listens."""

    def agents_url(self, settings: Settings, api_url: str) -> str:
        """Where node agents report, given where the notice API listens."""

    def reconcile(self, store: Store, check: Callable[[], None] | None = None) -> list[str]:
        """Tear down the backend's clusters the store does not hold live (``check``: a leader's fence)."""

    def notice_listener(self, store: Store, settings: Settings) -> Stoppable | None:
        """A started listener for the cloud's own notices, when the settings ask for one."""

    def beside_engine(self, store: Store, settings: Settings) -> list[Stoppable]:
        """What an embedded engine starts beside itself; each is stopped on ``close``."""

    def recover(self, store: Store) -> list[str]:
        """What the agents of an engine that was killed could not report, taken in by the next one;
        the ids of the jobs that gained a checkpoint."""


@dataclass
class Runtime:
    """The parts of one running broker: built by ``assemble``, whichever front end drives them."""

    settings: Settings
    store: Store
    # Kept in the store, so every replica derives the same agent tokens.
    tokens: SharedAgentTokens
    backend: Backend
    _server: Any = field(default=None, init=False, repr=False)  # the embedded engine's notice API
    _beside: list[Stoppable] = field(default_factory=list, init=False, repr=False)

    @property
    def clock(self) -> Clock:
        return self.backend.clock

    @property
    def market(self) -> Market:
        return self.backend.market

    @property
    def provisioner(self) -> Provisioner:
        return self.backend.provisioner

    @property
    def world(self) -> LocalWorld | None:
        """The local replay, on the local backend."""
        return self.backend.world

    def offered(self) -> frozenset[NodeKind] | None:
        return self.backend.offered()

    def intake(self) -> Intake:
        """What taking a job in needs of this broker: where it lives, its backend, what its market offers."""
        return Intake(self.settings.home, self.provisioner.name, self.offered(), offline=self.settings.offline_catalog,
                      max_gpus=self.settings.max_gpus, **budget_refusal(self.settings))

    def submit(self, job: JobSpec | Pipeline) -> list[str]:
        """``job`` stored PENDING once the market can hold it (``broker.intake.submit``); its job ids."""
        return submit(self.store, self.clock, self.intake(), job)

    def engine(self, broker_url: str | None, store: Store | None = None, provisioner: Provisioner | None = None,
               **extra: Any) -> Engine:
        """The engine over these parts; ``broker_url`` is where node agents report. A leader passes
        its fenced store and provisioner, so a stale leader can neither write nor call a cloud."""
        return Engine(store or self.store, self.clock, self.market, provisioner or self.provisioner,
                      engine_options(self.settings, broker_url, **extra), tokens=self.tokens)

    def reconcile(self, store: Store | None = None, check: Callable[[], None] | None = None) -> list[str]:
        return self.backend.reconcile(store or self.store, check)

    def start(self) -> Engine:
        """Serve the notice API and build the engine, with what the backend runs beside it (call only
        while holding the engine lock)."""
        from broker.api.app import BackgroundServer, create_app

        host, port = self.backend.api_address(self.settings)
        self._server = BackgroundServer(create_app(self.store, self.clock), host, port).start()
        engine = self.engine(self.backend.agents_url(self.settings, self._server.url))
        self.backend.recover(self.store)
        self._beside = self.backend.beside_engine(self.store, self.settings)
        return engine

    def close(self) -> None:
        for part in self._beside:
            part.stop()
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.stop()
        self.store.dispose()


def assemble(settings: Settings, store: Store | None = None, *, fresh_market: bool = False,
             world: Callable[[Store], LocalWorld] | None = None, sdk: Any = None, catalog: Any = None) -> Runtime:
    """The one way to put a broker together for ``settings.backend``.

    On the local backend, ``world`` picks the market replay (default: ``embedded_world``, kept
    unless ``fresh_market``): the local clusters and their market are one stand-in cloud. On
    SkyPilot the market is the price book, with SkyPilot's catalog only for offers it never quoted;
    ``sdk`` and ``catalog`` stand in for SkyPilot's own in tests.
    """
    private_directory(settings.home)
    store = store or open_store(settings.database_url)
    tokens = SharedAgentTokens(store, settings.home)
    backend: Backend
    if settings.backend == "skypilot":
        from broker.backends.skypilot.runtime import skypilot_backend

        backend = skypilot_backend(settings, store, sdk, catalog)
    else:
        from broker.backends.local.runtime import embedded_world, local_backend

        replay = world(store) if world is not None else embedded_world(settings, store, fresh_market)
        backend = local_backend(settings, replay)
    return Runtime(settings, store, tokens, backend)
