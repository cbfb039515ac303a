"""Published selection policies, registered so that every comparison runs them in the same setting.

All reason in whole steps through ``Budget`` and keep the NSDI'24 "Can't Be Late" safety net: a
job that is not on spot may only start spot while ``slack >= 2 x overhead + 1`` steps (a restart,
then a preemption that loses one step, still leave room to finish on on-demand); below that it
goes to on-demand and stays there.

``greedy`` and ``uniform_progress`` are single-zone policies (``single_zone = True``): they use the
first eligible offer, and the simulator runs them once per zone, as the paper does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from policies.selection import (
    ON_DEMAND,
    SELECTION_POLICIES,
    Budget,
    Location,
    Plan,
    SelectionRequest,
    ZoneOffer,
    current_offer,
    eligible_offers,
    on_demand_plan,
    spot_ok,
)

WAIT = Plan((), reason="wait for spot")


def single_zone(func: Callable[..., Any]) -> Callable[..., Any]:
    func.single_zone = True  # type: ignore[attr-defined]
    return func


def safety_net(budget: Budget) -> bool:
    """Off spot with less slack than a restart plus a preemption needs: on-demand until the end."""
    return budget.slack < 2 * budget.overhead + 1


def _stay(offer: ZoneOffer, reason: str = "stay on spot until preempted") -> Plan:
    return Plan((Location("spot", offer),), reason=reason)


def _cheapest_up(request: SelectionRequest, offers: list[ZoneOffer]) -> list[ZoneOffer]:
    n = request.job.num_nodes
    return sorted((o for o in offers if spot_ok(o, n)),
                  key=lambda o: (o.spot_price / max(o.gpus_per_node, 1), o.location))


@SELECTION_POLICIES.register("on_demand")
def on_demand(request: SelectionRequest) -> Plan:
    """Always on-demand: the cost every saving is measured against."""
    return on_demand_plan(request, "on-demand only")


@SELECTION_POLICIES.register("greedy")
@single_zone
def greedy(request: SelectionRequest) -> Plan:
    """NSDI'24 greedy: spot whenever the zone has it, wait otherwise, on-demand once slack runs out."""
    budget = Budget.of(request)
    if request.current.kind == ON_DEMAND:
        return on_demand_plan(request, "greedy stays on on-demand until the end")
    here = current_offer(request)
    if here is not None and spot_ok(here, request.job.num_nodes):
        return _stay(here)
    if safety_net(budget):
        return on_demand_plan(request, "safety net: slack below 2 restarts")
    offers = eligible_offers(request)[:1]
    if offers and spot_ok(offers[0], request.job.num_nodes):
        return _stay(offers[0], "spot is available")
    return WAIT


def _pace(request: SelectionRequest, budget: Budget) -> tuple[float, float, float]:
    """(progress done, progress that uniform pacing expects by now, work per step C(0)/R(0)), in steps.

    Without the job's total work and start, pacing starts now.
    """
    job = request.job
    total, span = budget.work, budget.left
    if job.total_work_s is not None and job.started_at is not None and job.deadline is not None:
        total = max(total, math.ceil(job.total_work_s / budget.step_s - 1e-6))
        span = max(span, math.floor((job.deadline - job.started_at).total_seconds() / budget.step_s + 1e-6))
    rate = total / max(span, 1)
    return float(total - budget.work), float(span - budget.left) * rate, rate


def _uniform_progress(request: SelectionRequest, offers: list[ZoneOffer]) -> Plan:
    budget = Budget.of(request)
    n = request.job.num_nodes
    here = current_offer(request)
    if here is not None and spot_ok(here, n):
        return _stay(here, "exploitation: stay on spot until preempted")
    up = _cheapest_up(request, offers)
    done, expected, rate = _pace(request, budget)
    if request.current.kind == ON_DEMAND:
        if safety_net(budget):
            return on_demand_plan(request, "safety net: slack below 2 restarts")
        if done < expected + 2 * budget.overhead * rate:  # cp(t) < ep(t + 2d)
            return on_demand_plan(request, "hysteresis: stay on on-demand until 2 restarts ahead")
        if up:
            return _stay(up[0], "ahead of uniform progress: back to spot")
        return WAIT
    if safety_net(budget):
        return on_demand_plan(request, "safety net: slack below 2 restarts")
    if up:
        return _stay(up[0], "taking risks: spot is available")
    if done < expected:
        return on_demand_plan(request, "behind uniform progress: catch up on on-demand")
    return WAIT


@SELECTION_POLICIES.register("uniform_progress")
@single_zone
def uniform_progress(request: SelectionRequest) -> Plan:
    """NSDI'24 Uniform Progress in one zone: pace progress evenly to the deadline, with hysteresis."""
    return _uniform_progress(request, eligible_offers(request)[:1])


@SELECTION_POLICIES.register("up_multi")
def up_multi(request: SelectionRequest) -> Plan:
    """Uniform Progress over every zone: after a preemption, the cheapest zone with capacity."""
    return _uniform_progress(request, eligible_offers(request))


@SELECTION_POLICIES.register("skypilot_eager")
def skypilot_eager(request: SelectionRequest) -> Plan:
    """SkyPilot EAGER_NEXT_REGION: relaunch at once, other regions than the preempted one first,
    cheapest first; no deadline or price-trend awareness, plus the on-demand safety net."""
    budget = Budget.of(request)
    n = request.job.num_nodes
    here = current_offer(request)
    if here is not None and spot_ok(here, n):
        return _stay(here)
    if request.current.kind == ON_DEMAND or safety_net(budget):
        return on_demand_plan(request, "safety net: slack below 2 restarts")
    preempted_region = _last_preempted_region(request)
    up = sorted(_cheapest_up(request, eligible_offers(request)),
                key=lambda o: o.region_key == preempted_region)  # stable: keeps cheapest-first within
    if up:
        return Plan(tuple(Location("spot", o) for o in up), reason="relaunch, next region first")
    return WAIT


def _last_preempted_region(request: SelectionRequest) -> str | None:
    latest = None
    where = None
    for location, record in request.record.items():
        if record.preemptions and (latest is None or record.preemptions[-1] > latest):
            latest, where = record.preemptions[-1], location
    if where is None:
        return None
    for offer in request.offers:
        if offer.location == where:
            return offer.region_key
    return None
