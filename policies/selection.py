"""Selection policies: where a job should run now, as an ordered list of locations.

Every policy is ``policy(request: SelectionRequest) -> Plan``, pure. The engine (live) and the
simulator (``broker simulate``) build the same request from the market and call the same function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from policies.history import MarketHistory
from policies.registry import Registry
from providers.base import OfferKey

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
    # the cloud's own expected run before preemption (GCP's estimated uptime or preemption rate,
    # broker.market.capacity.prior_uptime_s); None where it says nothing
    prior_uptime_s: float | None = None

    @property
    def location(self) -> str:
        return str(OfferKey(self.cloud, self.region, self.zone, self.instance_type))

    @property
    def region_key(self) -> str:
        """Where a checkpoint written from this zone lives: ``cloud/region``."""
        return f"{self.cloud}/{self.region}"


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
    allowed_places: frozenset[tuple[str, str | None]] = frozenset()  # (cloud, region or None for any); empty: any
    total_work_s: float | None = None  # the whole job's work, for policies that pace progress
    started_at: datetime | None = None  # when the job was submitted (the deadline counts from it)
    speed: tuple[tuple[str, float], ...] = ()  # stated relative speed per accelerator (policies.speed)


@dataclass(frozen=True, slots=True)
class SelectionRequest:
    now: datetime
    job: JobView
    offers: tuple[ZoneOffer, ...]
    current: Location = Location(IDLE)
    record: dict[str, ZoneRecord] = field(default_factory=dict)  # keyed by ZoneOffer.location
    excluded: frozenset[str] = frozenset()  # ZoneOffer.location values the job must leave/avoid
    history: MarketHistory | None = None  # the market up to now (prices, capacity), when known
    step_s: float | None = None  # how often the policy is asked; default: the history's tick, else 300 s
    checkpoint_region: str | None = None  # ZoneOffer.region_key of the latest checkpoint; None: none yet
    in_location_s: float = 0.0  # how long the job has been in ``current`` (restart overhead included)
    egress_per_gb: float = 0.0  # USD to move the checkpoint to another region or cloud


@dataclass(frozen=True, slots=True)
class Plan:
    """Locations to try, best first; empty means wait."""

    locations: tuple[Location, ...]
    reason: str = ""


NO_DEADLINE_TICKS = 10**9


@dataclass(frozen=True, slots=True)
class Budget:
    """The job's time in whole steps, as every deadline rule reasons about it.

    ``left`` steps remain before the deadline (now included), ``work`` steps of progress are still
    needed, ``overhead`` steps are lost on every (re)start, and ``slack = left - work`` is what
    waiting, restarts and preemptions may still spend. Running with progress keeps slack constant.
    """

    step_s: float
    overhead: int
    work: int
    left: int
    in_location: int  # steps already spent in the current location

    @property
    def slack(self) -> int:
        return self.left - self.work

    @property
    def overhead_left(self) -> int:
        """Restart steps still to pay if the job stays where it is (0 once it makes progress)."""
        return max(0, self.overhead - self.in_location)

    @classmethod
    def of(cls, request: SelectionRequest) -> Budget:
        step = request.step_s or (request.history.tick_seconds if request.history is not None else 300.0)
        job = request.job
        overhead = _ceil_steps(job.restart_overhead_s, step)
        work = _ceil_steps(job.remaining_work_s, step) if job.remaining_work_s is not None else 1
        if job.deadline is None:
            left = NO_DEADLINE_TICKS
        else:
            left = math.floor((job.deadline - request.now).total_seconds() / step + 1e-6)
        in_location = _floor_steps(request.in_location_s, step) if request.current.kind != IDLE else 0
        return cls(step, overhead, max(work, 0), left, in_location)


def _ceil_steps(seconds: float, step: float) -> int:
    return max(0, math.ceil(seconds / step - 1e-6))


def _floor_steps(seconds: float, step: float) -> int:
    return max(0, math.floor(seconds / step + 1e-6))


def spot_ok(offer: ZoneOffer, num_nodes: int) -> bool:
    """Spot in this zone can hold the gang now (unknown capacity counts as a chance)."""
    return offer.available_nodes is None or offer.available_nodes >= num_nodes


def on_demand_plan(request: SelectionRequest, reason: str) -> Plan:
    offers = sorted(_eligible(request), key=lambda o: (o.on_demand_price / max(o.gpus_per_node, 1), o.location))
    if not offers:  # every allowed zone is one to leave: on-demand in one of them beats none
        offers = sorted((o for o in request.offers if _allowed(request.job, o)),
                        key=lambda o: (o.on_demand_price, o.location))
    return Plan((Location(ON_DEMAND, offers[0]),) if offers else (), reason=reason)


def current_offer(request: SelectionRequest) -> ZoneOffer | None:
    """This step's offer for the spot zone the job is in, if it is in one."""
    cur = request.current
    if cur.kind != "spot" or cur.offer is None:
        return None
    where = cur.offer.location
    for offer in request.offers:
        if offer.location == where:
            return offer
    return None


def eligible_offers(request: SelectionRequest) -> list[ZoneOffer]:
    return [o for o in _eligible(request) if _affordable(request, o.spot_price)]


def _affordable(request: SelectionRequest, price_per_node: float) -> bool:
    cap = request.job.max_price_per_hour
    return cap is None or price_per_node * request.job.num_nodes <= cap + 1e-9


def _allowed(job: JobView, offer: ZoneOffer) -> bool:
    places = job.allowed_places
    return not places or (offer.cloud, None) in places or (offer.cloud, offer.region) in places


def _eligible(request: SelectionRequest) -> list[ZoneOffer]:
    return [o for o in request.offers if o.location not in request.excluded and _allowed(request.job, o)]


class SelectionPolicy(Protocol):
    """Where a job should run, best first."""

    def __call__(self, request: SelectionRequest, /) -> Plan: ...


SELECTION_POLICIES: Registry[SelectionPolicy] = Registry("selection")


@SELECTION_POLICIES.register("cheapest_spot")
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

