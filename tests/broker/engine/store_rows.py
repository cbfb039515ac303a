"""Rows written straight into the store for the engine modules' own tests, and the ``Parts`` they run
with: a clock stopped at a chosen market moment, the one-zone market, and the real local provisioner."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.clock import AcceleratedClock
from broker.engine import machine
from broker.engine.parts import EngineOptions, Parts
from broker.model import ClusterState, JobState
from broker.spec.job import parse_job_spec
from broker.store import Store
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from providers.local import LocalMarket
from providers.trace import read_trace
from tests.broker.engine.one_zone import one_zone_market

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
JOB = "name: train\nresources:\n  accelerators: V100:4\nrun: python train.py\n"


def stopped_clock(at: datetime = T0) -> AcceleratedClock:
    """A market clock that reads ``at`` to the microsecond for years of wall time after it."""
    return AcceleratedClock(at.timestamp(), 1e-15)


def submitted(store: Store, home: Path, text: str = JOB, at: datetime = T0) -> str:
    """A job submitted as the CLI would (PENDING, its spec stored), at market time ``at``."""
    return machine.submit_job(store, stopped_clock(at), parse_job_spec(text, offline=True), home, "local")


def set_job(store: Store, job_id: str, **fields: Any) -> None:
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        for name, value in fields.items():
            setattr(job, name, value)


def new_job(job_id: str, state: JobState = JobState.PENDING, **fields: Any) -> JobRow:
    values: dict[str, Any] = dict(id=job_id, name=job_id, team="ml", state=state.value, spec={},
                                  checkpoint_dir=f"/ckpt/{job_id}", num_nodes=1, gpus_per_node=4, zones=[],
                                  attempt=0, work_lost_s=0.0, created_at=T0, updated_at=T0)
    values.update(fields)
    return JobRow(**values)


def new_cluster(cluster_id: str, state: ClusterState = ClusterState.UP, job_id: str | None = None,
                **fields: Any) -> ClusterRow:
    values: dict[str, Any] = dict(id=cluster_id, launch_key=cluster_id, job_id=job_id, backend="local", cloud="aws",
                                  region="us-east-1", zone="us-east-1a", instance_type="p3.8xlarge",
                                  accelerator="V100", gpus_per_node=4, num_nodes=1, spot=True,
                                  price_per_node_hour=3.67, on_demand_price_per_node_hour=12.24, state=state.value,
                                  handle={}, created_at=T0,
                                  up_at=None if state is ClusterState.PROVISIONING else T0)
    values.update(fields)
    return ClusterRow(**values)


def new_allocation(job_id: str, cluster_id: str, attempt: int = 1, started: datetime = T0,
                   **fields: Any) -> AllocationRow:
    values: dict[str, Any] = dict(job_id=job_id, cluster_id=cluster_id, attempt=attempt, gpus={"0": [0, 1, 2, 3]},
                                  started_at=started)
    values.update(fields)
    return AllocationRow(**values)


def add(store: Store, *rows: object) -> None:
    """Write rows in order, each flushed before the next (a foreign key needs its row first)."""
    with store.transaction() as s:
        for row in rows:
            s.add(row)
            s.flush()


def make_parts(store: Store, home: Path, clock: AcceleratedClock | None = None, trace_path: Path | None = None,
               **options: Any) -> Parts:
    """An engine's parts on a market trace (the one-zone market unless given), with the local
    provisioner under ``home``."""
    clock = clock or stopped_clock()
    trace_path = trace_path or one_zone_market(home.parent / "one-zone.csv", available=4, minutes=120, start=T0)
    world = LocalWorld(str(trace_path), clock)
    market = LocalMarket(read_trace(trace_path), T0)
    return Parts(store, clock, market, LocalProvisioner(home, world), EngineOptions(home=home, **options),
                 tokens=lambda cluster_id: f"token-{cluster_id}")


def get(s: Session, table: type[Any], key: object) -> Any:
    row = s.get(table, key)
    assert row is not None, f"no {table.__name__} {key!r}"
    return row
