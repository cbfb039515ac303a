"""What the simpler rules would have paid on the market the job has seen: ``broker_lean``'s check on itself.

``broker``'s caution (waiting for good spot, on-demand when slack runs short, leaving zones whose
capacity dies young) pays where the market is hard and costs a little where it is easy, where the
simple rules (``up_multi``, ``skypilot_eager``: stay on spot until preempted, then the cheapest or
the next region's spot) are near the optimum. So every step, the job's own market since it started
is replayed under each rule (``broker`` itself among them, first), from the job's
start to now, with the simulator's accounting: a rule's replayed job pays for every running step,
loses a restart at every move and is preempted when its zone's capacity goes. Each replayed job is
then valued at what it has paid plus its work left at the cheapest spot price of now, with a share
of on-demand as its slack falls behind an even pace (all of it below the ``2 x restart + 1`` safety
net, since it must then finish there); the first rule leads until another's replayed job is worth
``LEAN_MARGIN`` and ``EVIDENCE_RESTARTS`` on-demand restarts less, so that noise does not make the
job flap between rules.

The replay is a pure function of the request: the market rows up to now (``request.history``), the
job's start, work and deadline, and the offers. It is kept in the series' memo keyed by all of
these, so the simulator's next tick extends it instead of starting over; a request whose history
does not reach back to the job's start (a live price book's recent rows) replays from its oldest
row. Without a history, the job's total work or its start, there is nothing to replay (None).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

from policies.history import MarketHistory
from policies.selection import (
    IDLE,
    ON_DEMAND,
    Budget,
    Location,
    Plan,
    SelectionRequest,
    ZoneOffer,
    ZoneRecord,
)

Rule = Callable[[SelectionRequest], Plan]
LEAN_MARGIN = 0.05  # another rule leads once its replayed job is worth this much less...
EVIDENCE_RESTARTS = 6  # ... and at least this many restarts on on-demand less (noise, not evidence, below)
IDLE_CODE, ON_DEMAND_CODE = -1, -2


@dataclass(frozen=True, slots=True)
class Track:
    """One rule's replayed job at the start of a tick."""

    location: int = IDLE_CODE  # zone column, IDLE_CODE or ON_DEMAND_CODE
    progress: int = 0
    in_location: int = 0
    overhead_left: int = 0
    checkpoint_region: str | None = None
    record: tuple[tuple[str, ZoneRecord], ...] = ()
    cost: float = 0.0


@dataclass(frozen=True, slots=True)
class Replay:
    """Every rule's replayed job at the start of tick ``tick``, and the rule leading then."""

    tick: int
    tracks: tuple[Track, ...]
    leader: int
    values: tuple[float, ...] = ()


def leading_rule(request: SelectionRequest, rules: tuple[Rule, ...]) -> Replay | None:
    """The replay of ``rules`` on the job's market from its start to now (None: nothing to replay)."""
    history, job = request.history, request.job
    if history is None or job.total_work_s is None or job.started_at is None or job.deadline is None:
        return None
    columns = tuple(history.column(o.location) for o in request.offers)
    if not request.offers or any(c is None for c in columns):
        return None
    budget = Budget.of(request)
    step = budget.step_s
    start = max(0, history.now - round((request.now - job.started_at).total_seconds() / step))
    work = math.ceil(job.total_work_s / step - 1e-6)
    key = ("broker.replay", tuple(id(r) for r in rules), start, work, job.deadline, budget.overhead,
           replace(job, remaining_work_s=None), request.offers[0].accelerator,
           tuple(o.location for o in request.offers), request.excluded, step, request.egress_per_gb)
    memo = history.series.memo
    found = memo.get(key)
    if not isinstance(found, Replay) or found.tick > history.now:
        found = Replay(start, tuple(Track() for _ in rules), 0)
    replay = _Replayer(request, rules, tuple(c for c in columns if c is not None), work, budget.overhead)
    while found.tick < history.now:
        found = replay.step(found)
    memo[key] = found
    return found


class _Replayer:
    """Advances every rule's replayed job by one tick, as the simulator's accounting does."""

    def __init__(self, request: SelectionRequest, rules: tuple[Rule, ...], columns: tuple[int, ...],
                 work: int, overhead: int) -> None:
        assert request.history is not None
        self.request, self.rules, self.columns = request, rules, columns
        self.series = request.history.series
        self.work, self.overhead = work, overhead
        self.step_s = Budget.of(request).step_s
        self.node_hours = request.job.num_nodes * self.step_s / 3600.0
        self.n = request.job.num_nodes

    def time_of(self, tick: int) -> timedelta:
        assert self.request.history is not None
        return timedelta(seconds=(tick - self.request.history.now) * self.step_s)

    def offers_at(self, tick: int) -> tuple[ZoneOffer, ...]:
        s = self.series
        return tuple(replace(o, spot_price=float(s.spot_price[tick, c]),
                             on_demand_price=float(s.on_demand_price[tick, c]),
                             available_nodes=int(s.available_nodes[tick, c]))
                     for o, c in zip(self.request.offers, self.columns, strict=True))

    def step(self, state: Replay) -> Replay:
        tick = state.tick
        offers = self.offers_at(tick)
        up = [o.available_nodes is not None and o.available_nodes >= self.n for o in offers]
        od_price = min(o.on_demand_price for o in offers)
        tracks = tuple(self._advance(rule, track, tick, offers, up, od_price)
                       for rule, track in zip(self.rules, state.tracks, strict=True))
        values = tuple(self._value(t, tick + 1, offers, od_price) for t in tracks)
        leader = state.leader
        best = min(range(len(values)), key=lambda i: (values[i], i))
        evidence = max(values[leader] * LEAN_MARGIN, EVIDENCE_RESTARTS * self.overhead * od_price * self.node_hours)
        if values[best] < values[leader] - evidence:
            leader = best
        return Replay(tick + 1, tracks, leader, values)

    def _value(self, track: Track, tick: int, offers: tuple[ZoneOffer, ...], od_price: float) -> float:
        """What the replayed job has paid, plus its work left at the cheapest spot price of now
        (at on-demand when its slack is below the safety net)."""
        left = self.work - track.progress
        if left <= 0:
            return track.cost
        job = self.request.job
        assert job.deadline is not None
        steps = math.floor((job.deadline - self.request.now).total_seconds() / self.step_s + 1e-6)
        steps += self.request.history.now - tick if self.request.history is not None else 0
        spot = min(o.spot_price for o in offers)
        slack = steps - left - track.overhead_left
        if slack < 2 * self.overhead + 1:
            short = 1.0
        else:  # behind the even pace (Uniform Progress's line), part of the rest is on on-demand
            assert job.started_at is not None
            span = (job.deadline - job.started_at).total_seconds() / self.step_s
            reserve = steps * max(span - self.work, 0.0) / max(span, 1e-9)
            short = min(1.0, max(0.0, (reserve - slack) / max(reserve, 1e-9)))
        price = spot + short * (od_price - spot)
        return track.cost + (left + track.overhead_left) * price * self.node_hours

    def _advance(self, rule: Rule, track: Track, tick: int, offers: tuple[ZoneOffer, ...], up: list[bool],
                 od_price: float) -> Track:
        here = track.location
        if track.progress >= self.work:
            return track
        record = dict(track.record)
        if here >= 0 and not up[here]:  # preempted: the tick is lost
            old = record.get(offers[here].location, ZoneRecord())
            record[offers[here].location] = replace(
                old, preemptions=(*old.preemptions, self.request.now + self.time_of(tick)))
            return replace(track, location=IDLE_CODE, in_location=0, record=tuple(record.items()))
        choice = self._decide(rule, track, tick, offers, up, record)
        if choice == IDLE_CODE:
            return replace(track, location=IDLE_CODE, in_location=0)
        overhead_left, region, cost = track.overhead_left, track.checkpoint_region, track.cost
        in_location = track.in_location
        if choice != here:
            overhead_left, in_location = self.overhead, 0
            if choice >= 0:
                new_region = offers[choice].region_key
                if region is not None and new_region != region:
                    cost += self.request.job.checkpoint_gb * self.request.egress_per_gb
                region = new_region
        cost += (offers[choice].spot_price if choice >= 0 else od_price) * self.node_hours
        progress = track.progress + (overhead_left == 0)
        overhead_left = max(0, overhead_left - 1) if overhead_left > 0 else 0
        return Track(choice, progress, in_location + 1, overhead_left, region, tuple(record.items()), cost)

    def _decide(self, rule: Rule, track: Track, tick: int, offers: tuple[ZoneOffer, ...], up: list[bool],
                record: dict[str, ZoneRecord]) -> int:
        request = self.request
        assert request.history is not None
        if track.location >= 0:
            current = Location("spot", offers[track.location])
        elif track.location == ON_DEMAND_CODE:
            current = Location(ON_DEMAND, min(offers, key=lambda o: o.on_demand_price))
        else:
            current = Location(IDLE)
        left = (self.work - track.progress) * self.step_s
        view = replace(request.job, remaining_work_s=left if request.job.remaining_work_s is not None else None)
        plan = rule(replace(request, now=request.now + self.time_of(tick), job=view, offers=offers,
                            current=current, record=record, history=MarketHistory(self.series, tick),
                            checkpoint_region=track.checkpoint_region,
                            in_location_s=track.in_location * self.step_s))
        where = {o.location: i for i, o in enumerate(offers)}
        for place in plan.locations:
            if place.kind == ON_DEMAND:
                return ON_DEMAND_CODE
            if place.kind == "spot" and place.offer is not None:
                z = where.get(place.offer.location)
                if z is not None and up[z]:
                    return z
        return IDLE_CODE
