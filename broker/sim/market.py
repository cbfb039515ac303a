"""Replay a market trace tick by tick and account for what a selection policy does with a job.

The semantics are fixed so that anyone can check a result from the timeline:

- time moves in the trace's ticks; at every tick the job is idle, on on-demand (always available,
  at the lowest on-demand price among the market's zones at that tick) or on spot in one zone;
- spot in zone z is possible at tick t only if ``available_nodes[t, z] >= num_nodes``; a gang on
  spot is preempted at the first tick where that fails: that tick is idle, costs nothing, makes no
  progress, and the progress so far is kept;
- entering a running location other than the previous tick's costs ``ceil(overhead / tick)``
  ticks at that location's price without progress;
- the checkpoint lives in the region of the last spot zone entered; entering a spot zone in
  another region pays ``checkpoint_gb x egress_per_gb`` once (the first spot launch pays none);
  on-demand runs where the checkpoint is and never moves it;
- a running tick costs ``price x num_nodes x tick_hours``; work is rounded up to whole ticks, the
  deadline down; past the trace's last tick its values hold, and a job still unfinished there
  (it has missed its deadline) finishes on on-demand.

The policy is asked once per tick (not at a preemption tick, which is lost whatever it says) and the
first location of its plan that is possible at that tick is taken; none possible means idle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from broker.engine.parts import CLOUD_RESTART_OVERHEAD_S
from broker.engine.planning import JobLimits, job_view
from broker.market.capacity import uptime_from
from policies.history import MarketHistory, MarketSeries
from policies.selection import (
    IDLE,
    ON_DEMAND,
    JobView,
    Location,
    Plan,
    SelectionRequest,
    ZoneOffer,
    ZoneRecord,
)
from providers.trace import MarketTrace

IDLE_CODE = -1
ON_DEMAND_CODE = -2


@dataclass(frozen=True, slots=True)
class SimJob:
    """The job as the simulator sees it: a gang and its work, deadline and restart costs."""

    num_nodes: int
    work_s: float
    deadline_s: float  # after the start
    restart_overhead_s: float = CLOUD_RESTART_OVERHEAD_S
    checkpoint_gb: float = 50.0
    egress_per_gb: float = 0.02
    accelerator: str | None = None
    gpus_per_node: int = 1
    work_known: bool = True  # False: the policy is not told the work (a job file with a deadline only)
    limits: JobLimits = field(default_factory=JobLimits)  # the job file's price cap, clouds and stated speeds

    def __post_init__(self) -> None:
        for name in ("num_nodes", "work_s", "deadline_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("restart_overhead_s", "checkpoint_gb", "egress_per_gb"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)!r}")

    @property
    def egress_cost(self) -> float:
        return self.checkpoint_gb * self.egress_per_gb


@dataclass(frozen=True, slots=True)
class Ticks:
    """A job's quantities in ticks of one market."""

    work: int  # rounded up
    deadline: int  # rounded down
    overhead: int  # rounded up

    @classmethod
    def of(cls, job: SimJob, tick_seconds: float) -> Ticks:
        return cls(
            work=max(1, math.ceil(job.work_s / tick_seconds - 1e-9)),
            deadline=math.floor(job.deadline_s / tick_seconds + 1e-9),
            overhead=max(0, math.ceil(job.restart_overhead_s / tick_seconds - 1e-9)),
        )


class Market:
    """A trace narrowed to the gang's instance types, with what every replay of it shares."""

    def __init__(self, trace: MarketTrace, num_nodes: int) -> None:
        if not trace.zones:
            raise ValueError("the market has no zones")
        self.trace = trace
        self.num_nodes = num_nodes
        self.series = MarketSeries.from_trace(trace)
        self.tick_seconds = trace.tick_seconds
        self.num_ticks = trace.num_ticks
        self.up = self.series.gang(num_nodes).up
        self.spot_price = trace.spot_price
        self.on_demand_min = trace.on_demand_price.min(axis=1)
        regions = sorted(set(self.series.regions))
        self.region_of = tuple(regions.index(r) for r in self.series.regions)
        self.column = dict(self.series.column)
        zones = [z.zone for z in trace.zones]
        unique = len(set(zones)) == len(zones)
        self.labels = tuple(zones) if unique else self.series.locations
        self._offers: list[tuple[ZoneOffer, ...] | None] = [None] * self.num_ticks
        self._times: list[datetime] | None = None

    def zone(self, index: int) -> Market:
        """The market of one zone alone, for single-zone policies."""
        trace = self.trace
        return Market(MarketTrace(trace.start, trace.tick_seconds, (trace.zones[index],),
                                  trace.spot_price[:, [index]], trace.on_demand_price[:, [index]],
                                  trace.available_nodes[:, [index]],
                                  {name: values[:, [index]] for name, values in trace.signals.items()}),
                      self.num_nodes)

    def time_of(self, tick: int) -> datetime:
        if self._times is None:
            self._times = [self.trace.time_of(t) for t in range(self.num_ticks)]
        return self._times[tick] if tick < self.num_ticks else self.trace.time_of(tick)

    def offers_at(self, tick: int) -> tuple[ZoneOffer, ...]:
        found = self._offers[tick]
        if found is None:
            trace = self.trace
            uptime, rate = trace.signals.get("estimated_uptime_s"), trace.signals.get("preemption_rate")
            found = self._offers[tick] = tuple(
                ZoneOffer(z.cloud, z.region, z.zone, z.instance_type, z.accelerator, z.gpus_per_node,
                          float(trace.spot_price[tick, i]), float(trace.on_demand_price[tick, i]),
                          int(trace.available_nodes[tick, i]),
                          prior_uptime_s=uptime_from(None if uptime is None else float(uptime[tick, i]),
                                                     None if rate is None else float(rate[tick, i])))
                for i, z in enumerate(trace.zones)
            )
        return found

    def label(self, code: int) -> str:
        if code == IDLE_CODE:
            return IDLE
        if code == ON_DEMAND_CODE:
            return ON_DEMAND
        return self.labels[code]

    def on_demand_cost(self, job: SimJob, start: int) -> float:
        """What running the whole job on on-demand from ``start`` costs (one restart, then the work)."""
        ticks = Ticks.of(job, self.tick_seconds)
        span = np.arange(start, start + ticks.overhead + ticks.work).clip(max=self.num_ticks - 1)
        return float(self.on_demand_min[span].sum()) * job.num_nodes * self.tick_seconds / 3600.0

    def latest_start(self, job: SimJob) -> int:
        """The last start tick whose deadline still falls inside the trace (-1: none does)."""
        return self.num_ticks - Ticks.of(job, self.tick_seconds).deadline


@dataclass(frozen=True)
class RunResult:
    policy: str
    start: int
    zone: str | None  # the zone a single-zone policy was given, else None
    cost: float
    cost_vs_on_demand: float
    spot_hours: float  # billed hours on spot (restart overhead included)
    on_demand_hours: float
    spot_work_hours: float  # hours of progress made on spot
    on_demand_work_hours: float
    preemptions: int
    migrations: int
    finish_hours: float
    deadline_met: bool
    locations: np.ndarray = field(repr=False)  # location code per tick from the start tick on

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "start": self.start,
            "cost": round(self.cost, 6),
            "cost_vs_on_demand": round(self.cost_vs_on_demand, 6),
            "spot_hours": round(self.spot_hours, 6),
            "on_demand_hours": round(self.on_demand_hours, 6),
            "preemptions": self.preemptions,
            "migrations": self.migrations,
            "finish_hours": round(self.finish_hours, 6),
            "deadline_met": self.deadline_met,
        }
        if self.zone is not None:
            out["zone"] = self.zone
        return out


Decide = Callable[[int, "RunState"], int]


@dataclass
class RunState:
    """The job's state between ticks, as the loop keeps it (mutable, private to one run)."""

    location: int = IDLE_CODE
    progress: int = 0
    in_location: int = 0  # ticks spent in the current running location
    checkpoint_region: int | None = None
    record: dict[str, ZoneRecord] = field(default_factory=dict)


def simulate(market: Market, job: SimJob, policy: Callable[[SelectionRequest], Plan], start: int,
             name: str = "policy", zone: str | None = None) -> RunResult:
    """Run one job from tick ``start`` under a per-tick policy."""
    return _run(market, job, _asker(market, job, policy, start), start, name, zone)


def replay(market: Market, job: SimJob, schedule: np.ndarray, start: int, name: str = "schedule",
           zone: str | None = None) -> RunResult:
    """Run one job from ``start`` following a fixed location code per tick (an omniscient plan)."""

    def decide(tick: int, state: RunState) -> int:
        i = tick - start
        return int(schedule[i]) if i < len(schedule) else ON_DEMAND_CODE

    return _run(market, job, decide, start, name, zone)


def _asker(market: Market, job: SimJob, policy: Callable[[SelectionRequest], Plan], start: int) -> Decide:
    ticks = Ticks.of(job, market.tick_seconds)
    tick_s = market.tick_seconds
    started = market.time_of(start)
    deadline = market.trace.time_of(start + ticks.deadline)
    total_work_s = ticks.work * tick_s
    regions = sorted(set(market.series.regions))
    column, up, series = market.column, market.up, market.series

    views: dict[int, JobView] = {}  # by progress: the job's view changes only when it progresses
    idle = Location(IDLE)

    def decide(tick: int, state: RunState) -> int:
        offers = market.offers_at(tick)
        if state.location >= 0:
            current = Location("spot", offers[state.location])
        elif state.location == ON_DEMAND_CODE:
            current = Location(ON_DEMAND, min(offers, key=_on_demand_price))
        else:
            current = idle
        view = views.get(state.progress)
        if view is None:
            view = views[state.progress] = job_view(
                job.limits, job.num_nodes, job.gpus_per_node, job.accelerator,
                (ticks.work - state.progress) * tick_s if job.work_known else None, deadline,
                job.restart_overhead_s, job.checkpoint_gb, total_work_s if job.work_known else None, started,
            )
        request = SelectionRequest(
            now=market.time_of(tick),
            job=view,
            offers=offers,
            current=current,
            record=state.record,
            history=MarketHistory(series, tick),
            step_s=tick_s,
            checkpoint_region=regions[state.checkpoint_region] if state.checkpoint_region is not None else None,
            in_location_s=state.in_location * tick_s,
            egress_per_gb=job.egress_per_gb,
        )
        plan = policy(request)
        for i, place in enumerate(plan.locations):
            if place.kind == ON_DEMAND:
                return ON_DEMAND_CODE
            if place.kind == "spot" and place.offer is not None:
                z = column.get(place.offer.location)
                if z is None:
                    continue
                if up[tick, z]:
                    return z
                if i == 0:
                    _note(state, place.offer.location, failed_at=request.now)
        return IDLE_CODE

    return decide


def _on_demand_price(offer: ZoneOffer) -> float:
    return offer.on_demand_price


def _note(state: RunState, location: str, preempted_at: datetime | None = None,
          failed_at: datetime | None = None) -> None:
    # A new dict each time: requests already handed out keep the record they were given.
    old = state.record.get(location, ZoneRecord())
    new = ZoneRecord(old.preemptions + ((preempted_at,) if preempted_at else ()),
                     old.failed_launches + ((failed_at,) if failed_at else ()))
    state.record = {**state.record, location: new}


def _run(market: Market, job: SimJob, decide: Decide, start: int, name: str, zone: str | None) -> RunResult:
    ticks = Ticks.of(job, market.tick_seconds)
    last = market.num_ticks - 1
    node_hours = job.num_nodes * market.tick_seconds / 3600.0
    up, spot, od = market.up, market.spot_price, market.on_demand_min
    state = RunState()
    cost = 0.0
    spot_ticks = od_ticks = spot_work = od_work = preemptions = migrations = 0
    overhead_left = 0
    last_running: int | None = None
    codes: list[int] = []
    tick = start
    while state.progress < ticks.work:
        at = min(tick, last)
        here = state.location
        if here >= 0 and not up[at, here]:
            preemptions += 1
            _note(state, market.series.locations[here], preempted_at=market.time_of(tick))
            state.location, state.in_location = IDLE_CODE, 0
            codes.append(IDLE_CODE)
            tick += 1
            continue
        choice = decide(tick, state) if tick <= last else ON_DEMAND_CODE
        if choice >= 0 and not up[at, choice]:
            choice = IDLE_CODE  # no capacity for the gang: the launch fails, the tick is idle
        if choice == IDLE_CODE:
            state.location, state.in_location = IDLE_CODE, 0
            codes.append(IDLE_CODE)
            tick += 1
            continue
        if choice != here:
            overhead_left = ticks.overhead
            if last_running is not None and choice != last_running:
                migrations += 1
            if choice >= 0:
                region = market.region_of[choice]
                if state.checkpoint_region is not None and region != state.checkpoint_region:
                    cost += job.egress_cost
                state.checkpoint_region = region
            state.location, state.in_location = choice, 0
        last_running = choice
        on_spot = choice >= 0
        cost += (spot[at, choice] if on_spot else od[at]) * node_hours
        working = overhead_left == 0
        if working:
            state.progress += 1
        else:
            overhead_left -= 1
        if on_spot:
            spot_ticks += 1
            spot_work += working
        else:
            od_ticks += 1
            od_work += working
        state.in_location += 1
        codes.append(choice)
        tick += 1
    hours = market.tick_seconds / 3600.0
    elapsed = tick - start
    return RunResult(
        policy=name, start=start, zone=zone, cost=cost,
        cost_vs_on_demand=cost / market.on_demand_cost(job, start),
        spot_hours=spot_ticks * hours, on_demand_hours=od_ticks * hours,
        spot_work_hours=spot_work * hours, on_demand_work_hours=od_work * hours,
        preemptions=preemptions, migrations=migrations, finish_hours=elapsed * hours,
        deadline_met=elapsed <= ticks.deadline, locations=np.array(codes, dtype=np.int16),
    )
