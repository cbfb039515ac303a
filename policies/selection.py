"""Selection policies: where a job should run now, as an ordered list of locations.

Every policy is ``policy(request: SelectionRequest) -> Plan``, pure. The engine (live) and the
simulator (``broker simulate``) build the same request from the market and call the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from policies.registry import register

ON_DEMAND = "on_demand"
IDLE = "idle"


@dataclass(frozen=True, slots=True)
class ZoneOffer:
    """One place the gang can run at this tick, with the market's view of it."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    gpus_per_node: int
    spot_price: float
    on_demand_price: float
    available_nodes: int | None  # None: unknown (live clouds give a score, not a count)
    capacity_score: float | None = None

    @property
    def location(self) -> str:
        return f"{self.cloud}/{self.zone}/{self.instance_type}"


@dataclass(frozen=True, slots=True)
class Location:
    """Where the job is or should be: ``kind`` is ``spot``, ``on_demand`` or ``idle``."""

    kind: str
    offer: ZoneOffer | None = None

    @property
    def label(self) -> str:
        if self.kind == "spot" and self.offer is not None:
            return self.offer.zone
        return self.kind


@dataclass(frozen=True, slots=True)
class ZoneRecord:
    """The broker's own memory of a zone: preemptions and failed launches, most recent last."""

    preemptions: tuple[datetime, ...] = ()
    failed_launches: tuple[datetime, ...] = ()


@dataclass(frozen=True, slots=True)
class JobView:
    num_nodes: int
    gpus_per_node: int
    accelerator: str | None
    remaining_work_s: float | None
    deadline: datetime | None
    restart_overhead_s: float = 720.0
    checkpoint_gb: float = 0.0
    max_price_per_hour: float | None = None  # for the whole gang
    allowed_clouds: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class SelectionRequest:
    now: datetime
    job: JobView
    offers: tuple[ZoneOffer, ...]
    current: Location = Location(IDLE)
    record: dict[str, ZoneRecord] = field(default_factory=dict)  # keyed by ZoneOffer.location
    excluded: frozenset[str] = frozenset()  # ZoneOffer.location values the job must leave/avoid


@dataclass(frozen=True, slots=True)
class Plan:
    """Locations to try, best first; empty means wait."""

    locations: tuple[Location, ...]
    reason: str = ""


def _affordable(request: SelectionRequest, price_per_node: float) -> bool:
    cap = request.job.max_price_per_hour
    return cap is None or price_per_node * request.job.num_nodes <= cap + 1e-9


def _eligible(request: SelectionRequest) -> list[ZoneOffer]:
    clouds = request.job.allowed_clouds
    return [
        o
        for o in request.offers
        if o.location not in request.excluded and (not clouds or o.cloud in clouds)
    ]


@register("selection", "cheapest_spot", default=True)
def cheapest_spot(request: SelectionRequest) -> Plan:
    """Spot offers with capacity for the whole gang, cheapest first, then on-demand as fallback."""
    offers = _eligible(request)
    spot = sorted(
        (o for o in offers
         if (o.available_nodes is None or o.available_nodes >= request.job.num_nodes)
         and _affordable(request, o.spot_price)),
        key=lambda o: (o.spot_price / max(o.gpus_per_node, 1), o.location),
    )
    on_demand = sorted(
        (o for o in offers if _affordable(request, o.on_demand_price)),
        key=lambda o: (o.on_demand_price / max(o.gpus_per_node, 1), o.location),
    )
    locations = [Location("spot", o) for o in spot]
    if on_demand:
        locations.append(Location(ON_DEMAND, on_demand[0]))
    return Plan(tuple(locations), reason="cheapest spot with capacity, on-demand last")
