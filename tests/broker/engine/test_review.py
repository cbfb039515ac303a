"""The review of a running job, once per market tick: a cheaper place has its cluster launched while
the job keeps running; once that cluster is up the job is told to checkpoint with its own signal; a
move whose launch failed is forgotten; a gang on a shared cluster stays put."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from broker.engine.parts import AfterCommit, Parts
from broker.engine.planning import Planner
from broker.engine.review import Reviewer
from broker.model import ClusterState, JobState
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow
from providers.base import SpotQuote
from providers.trace import write_trace
from tests.broker.engine.store_rows import (
    JOB,
    T0,
    add,
    get,
    make_parts,
    new_allocation,
    new_cluster,
    set_job,
    stopped_clock,
    submitted,
)

NOW = T0 + timedelta(minutes=30, seconds=10)
# The job's own cluster is its first ("here"): a move launches its second, a second try its third.
SIGNALLED = JOB + "broker:\n  checkpoint:\n    signal: SIGTERM\n"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    yield opened
    opened.dispose()


def _two_zones(path: Path) -> Path:
    """us-east-1a at its usual price, us-east-1b at about half, both with room, for two hours of minutes."""
    quotes = []
    for minute in range(120):
        at = T0 + timedelta(minutes=minute)
        quotes += [SpotQuote("aws", "us-east-1", zone, "p3.8xlarge", "V100", 4, price, 12.24, at, available_nodes=4)
                   for zone, price in (("us-east-1a", 3.67), ("us-east-1b", 1.90))]
    write_trace(path, quotes)
    return path


def _parts(store: Store, home: Path) -> Parts:
    return make_parts(store, home, stopped_clock(NOW), _two_zones(home.parent / "two-zones.csv"),
                      selection_policy="cheapest_spot")


def _running(store: Store, home: Path, zone: str = "us-east-1a", text: str = JOB, shared: bool = False) -> str:
    """A job running on a cluster of its own (or, ``shared``, on one launched for another job)."""
    job_id = submitted(store, home, text)
    set_job(store, job_id, state=JobState.RUNNING.value, attempt=1, started_at=T0)
    owner = submitted(store, home) if shared else job_id
    add(store, new_cluster("here", ClusterState.UP, job_id=owner, zone=zone),
        new_allocation(job_id, "here", running_at=T0))
    return job_id


def _review(store: Store, reviewer: Reviewer, job_id: str) -> AfterCommit:
    after = AfterCommit()
    with store.transaction() as s:
        job = get(s, JobRow, job_id)
        alloc = s.scalar(select(AllocationRow).where(AllocationRow.job_id == job_id, AllocationRow.attempt == 1))
        assert alloc is not None
        reviewer.review(s, job, alloc, get(s, ClusterRow, "here"), after)
    return after


def _job(store: Store, job_id: str) -> JobRow:
    with store.transaction() as s:
        job = get(s, JobRow, job_id)
        s.expunge(job)
        return job


def _kinds(store: Store, job_id: str) -> list[str]:
    with store.transaction() as s:
        return list(s.scalars(select(JobEventRow.kind).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)))


def _clusters(store: Store) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(ClusterRow)) or 0)


def test_a_cheaper_place_gets_its_cluster_launched_while_the_job_keeps_running(store: Store,
                                                                              broker_home: Path) -> None:
    parts = _parts(store, broker_home)
    job_id = _running(store, broker_home)
    after = _review(store, Reviewer(parts, Planner(parts)), job_id)
    job = _job(store, job_id)
    assert (job.state, job.target_cluster_id, job.checkpoint_requested_at) == ("RUNNING", f"{job_id}-c2", None)
    with store.transaction() as s:
        target = get(s, ClusterRow, f"{job_id}-c2")
        assert (target.state, target.zone, target.spot, target.price_per_node_hour) == (
            "PROVISIONING", "us-east-1b", True, 1.90)
    assert [i.id for i in after.launches] == [f"{job_id}-c2"] and after.signals == []
    assert _kinds(store, job_id)[-2:] == ["launch", "moving"]
    with store.transaction() as s:
        moving = s.scalar(select(JobEventRow).where(JobEventRow.kind == "moving"))
        assert moving is not None and moving.detail == {"to": "us-east-1b",
                                                        "reason": "cheapest spot with capacity, on-demand last"}


def test_a_job_already_in_the_best_place_stays(store: Store, broker_home: Path) -> None:
    parts = _parts(store, broker_home)
    job_id = _running(store, broker_home, zone="us-east-1b")
    after = _review(store, Reviewer(parts, Planner(parts)), job_id)
    assert after.launches == [] and _job(store, job_id).target_cluster_id is None and _clusters(store) == 1
    assert _kinds(store, job_id)[-1] == "submitted"


def test_a_gang_on_a_shared_cluster_stays_put(store: Store, broker_home: Path) -> None:
    parts = _parts(store, broker_home)
    job_id = _running(store, broker_home, shared=True)
    after = _review(store, Reviewer(parts, Planner(parts)), job_id)
    assert after.launches == [] and _job(store, job_id).target_cluster_id is None and _clusters(store) == 1


def test_while_the_new_cluster_comes_up_nothing_more_happens(store: Store, broker_home: Path) -> None:
    parts = _parts(store, broker_home)
    job_id = _running(store, broker_home)
    reviewer = Reviewer(parts, Planner(parts))
    _review(store, reviewer, job_id)
    parts.clock = stopped_clock(NOW + timedelta(minutes=5))  # later ticks: the target is still provisioning
    after = _review(store, reviewer, job_id)
    assert (after.launches, after.signals) == ([], [])
    assert _job(store, job_id).state == "RUNNING" and _clusters(store) == 2


def test_once_the_new_cluster_is_up_the_job_is_told_to_checkpoint_with_its_signal(store: Store,
                                                                                  broker_home: Path) -> None:
    parts = _parts(store, broker_home)
    job_id = _running(store, broker_home, text=SIGNALLED)
    reviewer = Reviewer(parts, Planner(parts))
    _review(store, reviewer, job_id)
    with store.transaction() as s:
        get(s, ClusterRow, f"{job_id}-c2").state = ClusterState.UP.value
    after = _review(store, reviewer, job_id)
    assert [(i.id, j, a, sig) for i, j, a, sig in after.signals] == [("here", job_id, 1, "SIGTERM")]
    assert after.launches == []
    job = _job(store, job_id)
    assert (job.state, job.checkpoint_reason, job.checkpoint_requested_at) == ("CHECKPOINTING", "move", NOW)
    with store.transaction() as s:
        alloc = s.scalar(select(AllocationRow).where(AllocationRow.job_id == job_id))
        assert alloc is not None and (alloc.stopping_at, alloc.ended_at) == (NOW, None)
        last = s.scalar(select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id.desc()))
        assert last is not None and (last.from_state, last.to_state) == ("RUNNING", "CHECKPOINTING")
        assert last.detail == {"checkpoint_reason": "move", "cluster": "here", "to": "us-east-1b",
                               "reason": "moving: the new nodes are up"}


def test_a_move_whose_launch_failed_is_forgotten_and_asked_again_only_on_the_next_tick(store: Store,
                                                                                       broker_home: Path) -> None:
    parts = _parts(store, broker_home)
    job_id = _running(store, broker_home)
    reviewer = Reviewer(parts, Planner(parts))
    _review(store, reviewer, job_id)
    with store.transaction() as s:
        get(s, ClusterRow, f"{job_id}-c2").state = ClusterState.FAILED.value
    after = _review(store, reviewer, job_id)  # the same tick: the failed move is dropped, the policy not asked
    job = _job(store, job_id)
    assert (job.state, job.target_cluster_id, job.target_gpus) == ("RUNNING", None, None)
    assert after.launches == [] and _clusters(store) == 2
    parts.clock = stopped_clock(NOW + timedelta(seconds=50))  # the next minute's tick
    after = _review(store, reviewer, job_id)
    assert [i.id for i in after.launches] == [f"{job_id}-c3"]
    assert _job(store, job_id).target_cluster_id == f"{job_id}-c3"
