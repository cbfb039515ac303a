"""The live engine and the simulator ask a policy the same question, so it answers the same: the selection
policy, and the fair-share policy (the engine's fair-share step against the multi-team replay)."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.backends.local.runtime import BUNDLED_MARKET
from broker.backends.skypilot.provisioner import SkyPilotProvisioner
from broker.backends.skypilot.runtime import store_specs
from broker.clock import AcceleratedClock
from broker.config.settings import load_settings
from broker.config.teams import FairShareConfig
from broker.engine import Engine, EngineOptions, engine_options
from broker.engine.fair_share import build_request
from broker.engine.planning import JobLimits
from broker.market.book import PriceBook
from broker.market.price_market import PriceBookMarket
from broker.sim.fair_share import TeamJob, replay
from broker.sim.market import Market, RunState, SimJob, _asker
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from broker.tokens import SharedAgentTokens
from policies import kinds
from policies.fair_share import FairShareDecision, FairShareRequest, Team
from policies.fair_share import weighted_fair_share as fair
from policies.selection import IDLE, Location, Plan, SelectionRequest
from providers.trace import read_trace
from tests.skystandin.server import SkyStandIn

JOB = """\
name: parity
num_nodes: 2
resources:
  accelerators: V100:1
run: python train.py
broker:
  work: 40m
  deadline: 3h
  max_price: 3.0  # for the gang: above some of the trace's spot prices, below others
  clouds: [aws, gcp]
"""


def _labels(plan: Plan) -> list[str]:
    return [location.label for location in plan.locations]


def test_engine_and_simulator_build_the_same_request_and_get_the_same_plan(broker_home: Path) -> None:
    trace = read_trace(BUNDLED_MARKET)
    settings = load_settings(market=BUNDLED_MARKET, speed=1.0)
    spec = parse_job_spec(JOB, source=str(broker_home / "job.yaml"), offline=True)
    store = open_store(settings.database_url)
    policy = kinds.selection.get("broker")

    market = Market(trace.select("V100", 1), spec.num_nodes)
    overhead = engine_options(settings, None).restart_overhead_s
    sim_job = SimJob(num_nodes=2, work_s=2400, deadline_s=3 * 3600, restart_overhead_s=overhead,
                     checkpoint_gb=0.0, egress_per_gb=0.02, accelerator="V100", gpus_per_node=1,
                     limits=JobLimits.of(spec))
    answers = []
    for tick in range(0, trace.num_ticks - 200, 7):
        seen: list[SelectionRequest] = []

        def recording(request: SelectionRequest, seen: list[SelectionRequest] = seen) -> Plan:
            seen.append(request)
            return policy(request)

        sim_plan_code = _asker(market, sim_job, recording, tick)(tick, RunState())
        (sim_request,) = seen

        # The engine, with its clock inside the same tick of the same replay, for a job submitted at it.
        world = LocalWorld(str(BUNDLED_MARKET), AcceleratedClock(time.time() - (tick + 0.5) * trace.tick_seconds, 1.0))
        engine = Engine(store, world.clock, world.market(trace), LocalProvisioner(broker_home, world),
                        engine_options(settings, None), tokens=SharedAgentTokens(store, broker_home))
        job_id = engine.submit(spec)
        with store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None
            job.created_at = world.market(trace).time_of(tick)  # submitted at the tick, as the simulator starts
            job.deadline = job.created_at + timedelta(hours=3)
            engine_request = engine.selection_request(s, job, Location(IDLE), set())
            job.state = "CANCELLED"

        # The replay sits at another point of the wall clock; every time the policy sees is the same
        # distance from the job's start.
        shift = engine_request.now - sim_request.now
        assert engine_request.job.started_at == sim_request.job.started_at + shift  # type: ignore[operator]
        assert engine_request.job.deadline == sim_request.job.deadline + shift  # type: ignore[operator]
        assert engine_request.offers == sim_request.offers
        assert sim_request.job.max_price_per_hour == 3.0
        assert sim_request.job.allowed_places == {("aws", None), ("gcp", None)}
        assert replace(engine_request.job, started_at=None, deadline=None) == \
            replace(sim_request.job, started_at=None, deadline=None)
        assert engine_request.history is not None and sim_request.history is not None
        assert engine_request.history.now == sim_request.history.now == tick
        assert (engine_request.step_s, engine_request.checkpoint_region, engine_request.in_location_s) == \
            (sim_request.step_s, sim_request.checkpoint_region, sim_request.in_location_s)
        engine_plan, sim_plan = policy(engine_request), policy(sim_request)
        assert _labels(engine_plan) == _labels(sim_plan)
        assert (sim_plan_code >= 0) == bool(sim_plan.locations and sim_plan.locations[0].kind == "spot")
        answers.append(tuple(_labels(engine_plan)[:1]))
    store.dispose()
    assert len(set(answers)) >= 2  # the ticks compared include different decisions


def test_on_the_price_book_the_engine_sees_the_past_the_simulator_sees(tmp_path: Path, skypilot: SkyStandIn) -> None:
    """The price book fed a trace's ticks as polls: the engine's request on the SkyPilot backend's
    market carries the same per-zone history (prices, capacity) as the simulator's at that tick, and
    the policy answers the same."""
    trace = read_trace(BUNDLED_MARKET).select("V100", 1)
    spec = parse_job_spec(JOB, offline=True)
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    policy = kinds.selection.get("broker")
    market = Market(trace, spec.num_nodes)
    sim_job = SimJob(num_nodes=2, work_s=2400, deadline_s=3 * 3600, restart_overhead_s=720.0, checkpoint_gb=0.0,
                     egress_per_gb=0.0, accelerator="V100", gpus_per_node=1, limits=JobLimits.of(spec))
    checked = (40, 120, 200)
    shift = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1) - trace.time_of(0)
    book = PriceBook(store)
    live = PriceBookMarket(book, history_tick_s=trace.tick_seconds, stale_after_s=10 * trace.tick_seconds)
    answers = []
    for tick in range(checked[-1] + 1):
        for cloud in sorted({z.cloud for z in trace.zones}):
            book.record(cloud, [q for q in trace.quotes_at(tick) if q.cloud == cloud], at=trace.time_of(tick) + shift)
        if tick not in checked:
            continue
        seen: list[SelectionRequest] = []

        def recording(request: SelectionRequest, seen: list[SelectionRequest] = seen) -> Plan:
            seen.append(request)
            return policy(request)

        _asker(market, sim_job, recording, 0)(tick, RunState())
        (sim_request,) = seen
        # A clock standing still at the tick (the policy's now on a live market is the clock's).
        clock = AcceleratedClock((trace.time_of(tick) + shift).timestamp(), 1e-12)
        engine = Engine(store, clock, live, SkyPilotProvisioner(tmp_path, store_specs(store), sdk=skypilot.sdk()),
                        EngineOptions(home=tmp_path, restart_overhead_s=720.0),
                        tokens=SharedAgentTokens(store, tmp_path))
        job_id = engine.submit(spec)
        with store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None
            job.created_at = trace.time_of(0) + shift  # submitted at the first tick, as the simulated job
            job.deadline = job.created_at + timedelta(hours=3)
            request = engine.selection_request(s, job, Location(IDLE), set())
            job.state = "CANCELLED"
        assert request.history is not None and sim_request.history is not None
        assert request.history.now == request.history.series.num_ticks - 1 == tick  # every tick since the first poll
        for location in sim_request.history.locations:
            ours, theirs = request.history.column(location), sim_request.history.column(location)
            assert ours is not None and theirs is not None
            for field in ("spot_price", "on_demand_price", "available_nodes"):
                mine, simulated = getattr(request.history, field), getattr(sim_request.history, field)
                assert (mine[:, ours] == simulated[:, theirs]).all()
        assert sorted(request.offers, key=str) == sorted(sim_request.offers, key=str)
        assert request.step_s == sim_request.step_s == trace.tick_seconds
        assert request.job.remaining_work_s == sim_request.job.remaining_work_s
        assert _labels(policy(request)) == _labels(policy(sim_request))
        answers.append(_labels(policy(request)))
    store.dispose()
    assert len(set(map(tuple, answers))) >= 2  # the ticks compared include different decisions


def test_the_fair_share_step_and_the_replay_ask_the_same_question_and_get_the_same_answer(db_url: str) -> None:
    """Team a's gangs hold 2 of the 4-GPU fleet (a0's GPU comes free in 10 minutes, a1's in almost 4 hours),
    b's 4-GPU gang waits longest, c (a tiny share: it can only borrow) has a short and a long gang waiting: the
    engine's request from the store and the replay's at the same moment carry the same shares, gangs, run
    times and predicted ends, and the fair-share policy decides the same (b's gang gets the reservation; c's
    short gang starts in a free GPU, its long one waits for b's)."""
    teams = (Team("a"), Team("b"), Team("c", weight=0.01))
    submitted, step = 600.0, 60.0
    jobs = [TeamJob("a", "a0", 1, 0.0, 1200.0), TeamJob("a", "a1", 1, 0.0, 4 * 3600.0),
            TeamJob("b", "b0", 4, submitted, 3600.0), TeamJob("c", "c0", 1, submitted, 1800.0),
            TeamJob("c", "c1", 1, submitted, 5 * 3600.0)]
    seen: list[FairShareRequest] = []

    def recording(request: FairShareRequest) -> FairShareDecision:
        seen.append(request)
        return fair(request)

    replay(jobs, teams, 4, recording, "fair", step_s=step, checkpoint_s=60.0, restart_s=60.0,
           horizon_s=submitted + step)
    assert len(seen) == submitted / step + 1
    sim = seen[-1]  # the step at which b's and c's gangs are first queued

    t0 = datetime(2026, 3, 10, 12, tzinfo=UTC)
    now = t0 + timedelta(seconds=submitted)
    store = open_store(db_url)
    with store.transaction() as s:
        s.add(ClusterRow(id="c1", launch_key="c1", backend="local", cloud="aws", region="r", zone="z",
                         instance_type="p3.8xlarge", accelerator="V100", gpus_per_node=4, num_nodes=1, spot=True,
                         price_per_node_hour=4.0, on_demand_price_per_node_hour=12.0, state="UP", handle={},
                         created_at=t0))
        for job in jobs:
            created = t0 + timedelta(seconds=job.submit_s)
            running = job.team == "a"
            s.add(JobRow(id=job.job_id, name=job.job_id, team=job.team, state="RUNNING" if running else "PENDING",
                         priority=500, spec={}, backend="local", num_nodes=1, gpus_per_node=job.gpus,
                         checkpoint_dir="/c", created_at=created, updated_at=created,
                         started_at=created if running else None, zones=[], work_s=job.duration_s))
        s.flush()
        s.add(AllocationRow(job_id="a0", cluster_id="c1", attempt=1, gpus={"0": [0]}, started_at=t0, running_at=t0))
        s.add(AllocationRow(job_id="a1", cluster_id="c1", attempt=1, gpus={"0": [1]}, started_at=t0,
                            running_at=t0))
    config = FairShareConfig(teams=teams, half_life_s=3600.0, capacity_gpus=4)
    with store.transaction() as s:
        live = build_request(s, config, list(s.scalars(select(JobRow))), now)
    store.dispose()

    assert (live.capacity_gpus, live.teams, live.half_life_s) == (sim.capacity_gpus, sim.teams, sim.half_life_s)
    assert {u.team: u.held_gpus for u in live.usage if u.held_gpus} == {u.team: u.held_gpus for u in sim.usage}
    # Usage: the engine integrates the allocations, the replay sums its steps.
    sim_usage = {u.team: u.decayed_gpu_s for u in sim.usage}
    assert {u.team: u.decayed_gpu_s for u in live.usage if u.decayed_gpu_s} == pytest.approx(sim_usage, rel=0.02)

    def gangs(request: FairShareRequest) -> list[tuple[str, str, int, int, float | None]]:
        return [(g.job_id, g.team, g.gpus, g.priority, g.runtime_s)
                for g in sorted(request.queued, key=lambda g: g.order)]

    assert gangs(live) == gangs(sim) == [("b0", "b", 4, 500, 3600.0), ("c0", "c", 1, 500, 1800.0),
                                         ("c1", "c", 1, 500, 5 * 3600.0)]
    assert sorted(live.releases) == sorted(sim.releases) == [(600.0, 1), (4 * 3600.0 - submitted, 1)]
    assert sorted(live.team_releases) == sorted(sim.team_releases) == \
        [("a", 600.0, 1), ("a", 4 * 3600.0 - submitted, 1)]
    live_decision, sim_decision = fair(live), fair(sim)
    assert live_decision == sim_decision
    assert sim_decision.admit == ("c0",)
    assert sim_decision.reason_of("c1") == \
        "waiting: the free GPUs are reserved for b0 (4 GPUs), which starts first, in about 230 min"
