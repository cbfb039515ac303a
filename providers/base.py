"""The contract every cloud module in ``providers/`` keeps, and the quote they all produce.

A provider module holds facts from one cloud (catalog, prices, capacity signals, the node-side
preemption-notice reader). It never decides anything and never imports ``broker`` internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

# The clouds with a catalog and price APIs, and every cloud a job may name (``local``: this machine).
PUBLIC_CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")
CLOUDS: tuple[str, ...] = (*PUBLIC_CLOUDS, "local")


@dataclass(frozen=True, slots=True)
class OfferKey:
    """Where a node type can be bought: one instance type in one zone of one cloud."""

    cloud: str
    region: str
    zone: str
    instance_type: str

    def __str__(self) -> str:
        return f"{self.cloud}/{self.zone}/{self.instance_type}"


@dataclass(frozen=True, slots=True)
class SpotQuote:
    """What one cloud says, at one moment, about one instance type in one zone.

    Prices are USD per node-hour. ``available_nodes`` is how many spot nodes could be had now
    (known exactly only for traces); ``capacity_score`` is the cloud's own signal where it gives
    one (AWS spot placement score 1-10), ``None`` elsewhere. GCP's ``advice.capacity`` gives
    ``obtainability`` (0-1, the chance a spot request succeeds now) and ``estimated_uptime_s`` (how
    long most spot VMs run before preemption); Azure's Spot Placement Score gives
    ``placement_level`` ("High", "Medium" or "Low"). GCP's ``advice.capacityHistory`` gives
    ``preemption_rate``, the share of the type's Spot VMs that stopped on its latest day that were
    preempted (0-1). Each is ``None`` where the cloud said nothing.
    """

    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    gpus_per_node: int
    spot_price: float | None
    on_demand_price: float | None
    observed_at: datetime
    gpu_memory_gb: float | None = None
    available_nodes: int | None = None
    capacity_score: float | None = None
    obtainability: float | None = None
    estimated_uptime_s: float | None = None
    placement_level: str | None = None
    preemption_rate: float | None = None
    stale: bool = False

    @property
    def key(self) -> OfferKey:
        return OfferKey(self.cloud, self.region, self.zone, self.instance_type)


class ProviderError(Exception):
    """The error base of ``providers/`` (which may not import ``broker``; ``broker.errors`` maps these)."""


class ProviderInputError(ProviderError):
    """Input the user can fix (a trace file, an instance type they named): exit 2 in the CLI."""


class CloudUnavailable(ProviderError, RuntimeError):
    """The cloud cannot be asked at all (no credentials, SDK missing); skip it with one line."""


class PriceSource(Protocol):
    """A cloud's price and catalog poller: one implementation per cloud module."""

    cloud: str

    def fetch_quotes(self, regions: list[str] | None = None) -> list[SpotQuote]: ...
