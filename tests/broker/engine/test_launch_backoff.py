"""A spot offer that refused a launch is left alone by every job until the market's next tick (a live
market: ``LAUNCH_BACKOFF``), not retried by each queued job in turn."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.engine import Engine, EngineOptions
from broker.model import ClusterState, TeardownReason
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import ClusterRow, JobRow
from policies.selection import IDLE, Location
from providers.base import SpotQuote
from providers.trace import write_trace

REFUSED = "aws/us-east-1a/p3.8xlarge"


def _market(path: Path) -> Path:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    write_trace(path, [SpotQuote("aws", "us-east-1", zone, "p3.8xlarge", "V100", 4, price, 12.24,
                                 start + timedelta(minutes=m), available_nodes=5)
                       for m in range(60) for zone, price in (("us-east-1a", 3.0), ("us-east-1b", 3.5))])
    return path


def _failed(engine: Engine, job_id: str, at: datetime) -> None:
    with engine.store.transaction() as s:
        s.add(ClusterRow(id=f"{job_id}-c1", launch_key=f"{job_id}:1", job_id=job_id, backend="local", cloud="aws",
                         region="us-east-1", zone="us-east-1a", instance_type="p3.8xlarge", accelerator="V100",
                         gpus_per_node=4, num_nodes=1, spot=True, price_per_node_hour=3.0,
                         on_demand_price_per_node_hour=12.24, state=ClusterState.FAILED.value,
                         teardown_reason=TeardownReason.LAUNCH_FAILED.value, created_at=at, terminated_at=at,
                         handle={}))


def test_a_zone_that_refused_one_job_is_not_planned_for_the_next_until_the_market_ticks(tmp_path: Path) -> None:
    world = LocalWorld.begin(tmp_path, str(_market(tmp_path / "market.csv")), 1e-9)  # the market time stands still
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    try:
        engine = Engine(store, world.clock, world.market(), LocalProvisioner(tmp_path, world, 600.0),
                        EngineOptions(home=tmp_path, restart_overhead_s=60.0), tokens=lambda c: f"t-{c}")
        spec = parse_job_spec("name: t\nresources:\n  accelerators: V100:4\nrun: 'true'\n",
                              source=str(tmp_path / "t.yaml"), offline=True)
        first, second = engine.submit(spec), engine.submit(spec)

        def plan_of(job_id: str) -> tuple[set[str], str | None]:
            with store.transaction() as s:
                job = s.get(JobRow, job_id)
                assert job is not None
                exclude = engine.planner.avoid(s, job)
                plan = engine.planner.plan(s, job, Location(IDLE), exclude)
                spot = [loc.offer.location for loc in plan.locations
                        if loc.offer is not None and loc.kind == "spot" and loc.offer.location not in exclude]
                return exclude, spot[0] if spot else None

        assert plan_of(second) == (set(), REFUSED)  # the cheaper zone, while nothing says it is full
        now = engine.clock.now()
        _failed(engine, first, now)
        exclude, zone = plan_of(second)
        assert exclude == {REFUSED} and zone == "aws/us-east-1b/p3.8xlarge"

        with store.transaction() as s:  # the refusal was in an earlier tick: the market has changed since
            row = s.scalar(select(ClusterRow).where(ClusterRow.job_id == first))
            assert row is not None
            row.terminated_at = engine.planner.policy_now() - timedelta(seconds=1)
        assert plan_of(second) == (set(), REFUSED)
        assert REFUSED in plan_of(first)[0]  # the job it refused keeps away from it for longer
    finally:
        store.dispose()
