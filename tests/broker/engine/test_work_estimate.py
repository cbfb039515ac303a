"""The engine estimates the work of a job file with a deadline and no ``work`` from its name's history."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.backends.local.runtime import BUNDLED_MARKET
from broker.clock import AcceleratedClock
from broker.config.settings import load_settings
from broker.engine import Engine, engine_options
from broker.engine.planning import work_estimate
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from broker.tokens import SharedAgentTokens
from policies import kinds
from policies.selection import IDLE, Location
from providers.trace import read_trace

JOB = """\
name: nightly
num_nodes: 1
resources:
  accelerators: V100:1
run: python train.py
broker:
  team: vision
  deadline: 30d
"""


def test_deadline_only_job_is_estimated_from_its_name_and_team_then_runs_on_spot(broker_home: Path) -> None:
    trace = read_trace(BUNDLED_MARKET)
    settings = load_settings(market=BUNDLED_MARKET, speed=1.0)
    spec = parse_job_spec(JOB, source=str(broker_home / "job.yaml"), offline=True)
    other_team = parse_job_spec(JOB.replace("vision", "audio"), source=str(broker_home / "job.yaml"), offline=True)
    store = open_store(settings.database_url)
    world = LocalWorld(str(BUNDLED_MARKET), AcceleratedClock(time.time(), 1.0))
    engine = Engine(store, world.clock, world.market(trace), LocalProvisioner(broker_home, world),
                    engine_options(settings, None), tokens=SharedAgentTokens(store, broker_home))
    first = engine.submit(spec)
    with store.transaction() as s:
        job = s.get(JobRow, first)
        assert job is not None
        assert work_estimate(s, job, engine.clock.now()).remaining_s is None  # no history: unknown
        plan = kinds.selection.get("broker")(engine.selection_request(s, job, Location(IDLE), set()))
        assert plan.locations and plan.locations[0].kind == "spot", plan.reason
        # it ran 5 hours and finished
        now = world.clock.now()
        s.add(ClusterRow(id="c1", launch_key="k1", job_id=first, backend="local", cloud="aws", region="us-east-1",
                         zone="us-east-1a", instance_type="p3.2xlarge", accelerator="V100", gpus_per_node=1,
                         num_nodes=1, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0,
                         state="TERMINATED", created_at=now - timedelta(hours=6)))
        s.flush()
        s.add(AllocationRow(job_id=first, cluster_id="c1", attempt=1, gpus={}, started_at=now - timedelta(hours=6),
                            running_at=now - timedelta(hours=5), ended_at=now, outcome="succeeded"))
        job.state, job.finished_at = "SUCCEEDED", now
    second, third = engine.submit(spec), engine.submit(other_team)
    with store.transaction() as s:
        job = s.get(JobRow, second)
        assert job is not None
        found = work_estimate(s, job, engine.clock.now())
        assert (found.source, found.total_s, found.remaining_s) == ("history", 5 * 3600.0, 5 * 3600.0)
        request = engine.selection_request(s, job, Location(IDLE), set())
        assert request.job.remaining_work_s == 5 * 3600.0
        assert kinds.selection.get("broker")(request).locations[0].kind == "spot"
        other = s.get(JobRow, third)
        assert other is not None and work_estimate(s, other, engine.clock.now()).source == "unknown"
        for row in (job, other):
            row.state = "CANCELLED"
    store.dispose()
