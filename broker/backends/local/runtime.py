"""The local backend put together: clusters are local process groups, and the market trace they
replay is both the stand-in cloud's clock and its market.

``broker.runtime.assemble`` builds a ``LocalBackend`` over a replay: ``embedded_world`` for the
one-process broker of the CLI, ``shared_world`` for the replicas of ``broker serve``.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.backends.local.reconcile import reconcile_local
from broker.backends.local.recovery import publish_address, recover_checkpoints
from broker.clock import AcceleratedClock
from broker.engine.machine import active_job_count
from providers.local import LocalMarket

if TYPE_CHECKING:
    from broker.config.settings import Settings
    from broker.store import Store

BUNDLED_MARKET = Path(__file__).parents[2] / "data" / "quickstart-market.csv"


def embedded_world(settings: Settings, store: Store, fresh: bool) -> LocalWorld:
    """The local replay of a one-process broker: kept while jobs are active or unless ``fresh``."""
    existing = LocalWorld.load(settings.home)
    trace = str(settings.market or BUNDLED_MARKET)
    busy = active_job_count(store) > 0
    if existing is not None and (busy or not fresh):
        return existing
    return LocalWorld.begin(settings.home, trace, settings.speed)


def shared_world(home: Path, trace: str, speed: float, store: Store) -> LocalWorld:
    """The local market replay all replicas on this broker home share, begun by the first of them.

    An existing replay is kept when it plays the same trace at the same speed, or while jobs are
    active (their clusters run on its clock); otherwise a new one begins. A file lock makes
    replicas starting together agree on one.
    """
    (home / "local").mkdir(parents=True, exist_ok=True)
    with open(home / "local" / "world.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            existing = LocalWorld.load(home)
            wanted = str(Path(trace).resolve())
            if existing is not None and (
                    (existing.trace_path == wanted and existing.clock.speed == speed) or active_job_count(store) > 0):
                return existing
            return LocalWorld.begin(home, trace, speed)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def served_world(settings: Settings) -> Callable[[Store], LocalWorld]:
    """The replay ``broker serve``'s replicas share (``shared_world`` over the settings' trace)."""
    trace = str(settings.market or BUNDLED_MARKET)
    return lambda store: shared_world(settings.home, trace, settings.speed, store)


@dataclass
class LocalBackend:
    """The local backend's parts: the replay, its market and the provisioner of its clusters."""

    world: LocalWorld
    provisioner: LocalProvisioner
    market: LocalMarket = field(init=False)

    def __post_init__(self) -> None:
        self.market = self.world.market()

    @property
    def clock(self) -> AcceleratedClock:
        return self.world.clock

    def offered(self) -> frozenset[tuple[str, int, str]]:
        """(accelerator, GPUs per node, instance type) of every zone the trace replays: a job asking for
        more, or for a type the trace lacks, is never held."""
        return frozenset((z.accelerator, z.gpus_per_node, z.instance_type) for z in self.market.trace.zones)

    def api_address(self, settings: Settings) -> tuple[str, int]:
        return "127.0.0.1", 0  # the agents are local processes

    def agents_url(self, settings: Settings, api_url: str) -> str:
        """The agents' address file, which holds ``api_url`` now: an engine started after this one was
        killed rewrites it, and the agents already running report to that one (``recovery``)."""
        return publish_address(settings.home, api_url)

    def recover(self, store: Store) -> list[str]:
        """The checkpoints a killed engine's agents could not report, read from this machine's disk."""
        return recover_checkpoints(store, self.clock)

    def reconcile(self, store: Store, check: Callable[[], None] | None = None) -> list[str]:
        return reconcile_local(store, self.provisioner.root, check)

    def notice_listener(self, store: Store, settings: Settings) -> Any:
        return None  # a local node's notices come from its agent only

    def beside_engine(self, store: Store, settings: Settings) -> list[Any]:
        return []


def local_backend(settings: Settings, world: LocalWorld) -> LocalBackend:
    return LocalBackend(world, LocalProvisioner(settings.home, world, settings.local_provision_seconds))
