"""The live engine and the simulator ask the selection policy the same question, so it answers the same."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.backends.local.runtime import BUNDLED_MARKET
from broker.backends.skypilot.provisioner import SkyPilotProvisioner
from broker.backends.skypilot.runtime import store_specs
from broker.clock import AcceleratedClock
from broker.config.settings import load_settings
from broker.engine import Engine, EngineOptions, engine_options
from broker.engine.planning import JobLimits
from broker.market.book import PriceBook
from broker.market.price_market import PriceBookMarket
from broker.sim.market import Market, RunState, SimJob, _asker
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import JobRow
from broker.tokens import SharedAgentTokens
from policies import kinds
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
