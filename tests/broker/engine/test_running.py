"""The running jobs' fast path (``broker.engine.running``) passes over only the running jobs the full
decision would leave as they are: on a seeded scenario (runs that go on, end, fail, get a notice, are
due a checkpoint, own their cluster), a step's first pass over every active job writes exactly what
the reference path writes, in the same order, in fewer statements."""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, select

from broker.backends.local.claims import identity
from broker.engine.cadence import ASKED
from broker.engine.running import Running, RunningView
from broker.model import JobState
from broker.notices.record import Notice, record_notice
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow
from tests.broker.engine.test_queue import _copy, _engine, _seed, _written


@pytest.fixture
def stand_in() -> Iterator[int]:
    """One process standing in for every local cluster's host and every node's agent (alive, its own group)."""
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def _local_cloud(home: Path, store: Store, pid: int) -> None:
    """The local cloud's files for the seeded clusters and runs, as its hosts and agents write them."""
    root = home / "local" / "clusters"
    with store.transaction() as s:
        for cluster in s.scalars(select(ClusterRow)):
            directory = root / cluster.id
            (directory / "procs").mkdir(parents=True, exist_ok=True)
            (directory / "cluster.json").write_text(json.dumps({"cluster_id": cluster.id}))
            (directory / "status.json").write_text(json.dumps({"state": "UP", "host_pid": pid, "metadata_port": 1}))
            cluster.handle = {"metadata_port": 1, "dir": str(directory)}
        for alloc in s.scalars(select(AllocationRow).where(AllocationRow.ended_at.is_(None))):
            run = root / alloc.cluster_id / "runs" / f"{alloc.job_id}-{alloc.attempt}"
            (run / "node-0").mkdir(parents=True, exist_ok=True)
            (run / "gang.json").write_text(json.dumps({"nodes": 1, **identity(pid)}))
            (run / "node-0" / "started").write_text(json.dumps(identity(pid)))


def _stir(home: Path, store: Store, seed: int) -> None:
    """Give the running jobs each something different: one cluster has a notice; elsewhere one run
    succeeded, one failed, one job owns its cluster and one is due a checkpoint (the four above any
    queued job's priority, so none is preempted first); of the rest, most were asked for a checkpoint
    a minute ago (not due) and a few were not (due)."""
    rng = random.Random(seed)
    engine = _engine(home, store)
    now = engine.clock.now()
    with store.transaction() as s:
        running = list(s.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value).order_by(JobRow.id)))
        allocs = {a.job_id: a for a in s.scalars(select(AllocationRow).where(
            AllocationRow.ended_at.is_(None), AllocationRow.job_id.in_([job.id for job in running])))}
        noticed = rng.choice(sorted({a.cluster_id for a in allocs.values()}))
        # the runs that end, fail or own their cluster are elsewhere: a notice comes first on its cluster
        elsewhere = [job for job in running if allocs[job.id].cluster_id != noticed]
        ended, failed, owner, due = rng.sample(elsewhere, 4)
        for job in (ended, failed, owner, due):
            job.priority = 10_000  # no queued job may take their GPUs first
        for job in running:
            if job is due or rng.random() < 0.2:
                continue  # 30 minutes running, never asked: a checkpoint is due
            s.add(JobEventRow(job_id=job.id, at=now - timedelta(minutes=1), kind=ASKED, detail={}))
        for job, code in ((ended, 0), (failed, 1)):
            alloc = allocs[job.id]
            node = home / "local" / "clusters" / alloc.cluster_id / "runs" / f"{job.id}-1" / "node-0"
            (node / "status").write_text(json.dumps({"exit_code": code}))
        cluster = s.get(ClusterRow, allocs[owner.id].cluster_id)
        assert cluster is not None
        cluster.job_id = owner.id
    record_notice(store, engine.clock, Notice(noticed, "terminate", action_time=now + timedelta(minutes=2)),
                  source="backend")


def _first_pass(home: Path, fast: bool) -> tuple[list[tuple[str, str, str | None, object]], int, dict[str, str]]:
    store = open_store(f"sqlite:///{home / 'store.db'}")
    try:
        engine = _engine(home, store, queue_fast_path=fast)
        with store.transaction() as s:
            since = int(s.scalar(select(JobEventRow.id).order_by(JobEventRow.id.desc()).limit(1)) or 0)
        statements = [0]
        event.listen(store.engine, "before_cursor_execute", lambda *_: statements.__setitem__(0, statements[0] + 1))
        engine.advance_all(engine.active_jobs(), running=True)
        with store.transaction() as s:
            states = {job_id: state for job_id, state in s.execute(select(JobRow.id, JobRow.state))}
        return _written(store, since), statements[0], states
    finally:
        store.dispose()


@pytest.mark.parametrize("seed", [5, 23])
def test_a_pass_over_running_and_queued_jobs_decides_as_the_reference_path_does(
        tmp_path: Path, stand_in: int, seed: int) -> None:
    home = tmp_path / "seeded"
    home.mkdir()
    store = _seed(home, 20, seed)
    try:
        _local_cloud(home, store, stand_in)
        _stir(home, store, seed)
    finally:
        store.dispose()
    reference, fast = tmp_path / "reference", tmp_path / "fast"
    _copy(home, reference)
    _copy(home, fast)
    expected, slow_statements, expected_states = _first_pass(reference, fast=False)
    got, fast_statements, states = _first_pass(fast, fast=True)
    assert got == expected
    assert states == expected_states
    kinds = {kind for _, kind, _, _ in got}
    moved_to = {t for _, _, t, _ in got}

    assert {JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CHECKPOINTING.value} <= moved_to
    assert ASKED in kinds  # the jobs due a checkpoint were asked, on both paths
    assert fast_statements < slow_statements, (fast_statements, slow_statements)


def test_the_view_says_which_running_jobs_are_quiet(db_url: str, tmp_path: Path, stand_in: int) -> None:
    home = tmp_path / "home"
    home.mkdir()
    seeded = _seed(home, 0, seed=3)
    _local_cloud(home, seeded, stand_in)
    seeded.dispose()
    store = open_store(f"sqlite:///{home / 'store.db'}")
    if not db_url.startswith("sqlite"):  # the same rows, on PostgreSQL
        target = open_store(db_url)
        target.migrate()
        _copy_rows(store, target)
        store.dispose()
        store = target
    try:
        engine = _engine(home, store)
        now = engine.clock.now()
        with store.transaction() as s:
            running = list(s.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value)
                                     .order_by(JobRow.id)))
            asked, due = running[0], running[1]
            for job in [*running[2:], asked]:
                s.add(JobEventRow(job_id=job.id, at=now - timedelta(minutes=1), kind=ASKED, detail={}))
        view = RunningView(engine.parts, engine.jobs.cadence, engine.jobs.reviewer)
        assert set(view.running) == {job.id for job in running}
        assert view.quiet(asked.id)
        assert not view.quiet(due.id)  # 30 minutes running, never asked: a checkpoint is due
        assert not view.quiet("no-such-job")
        cluster_id = next(iter(view.running.values())).cluster.id
        record_notice(store, engine.clock, Notice(cluster_id, "terminate"), source="backend")
        view = RunningView(engine.parts, engine.jobs.cadence, engine.jobs.reviewer)
        assert all(not view.quiet(j) for j, r in view.running.items() if r.cluster.id == cluster_id)
    finally:
        store.dispose()


def _copy_rows(source: Store, target: Store) -> None:
    from broker.store.tables import Base

    with source.transaction() as s, target.transaction() as t:
        for table in Base.metadata.sorted_tables:
            if table.name in ("jobs", "clusters", "allocations"):
                rows = [dict(r._mapping) for r in s.execute(table.select())]
                if rows:
                    t.execute(table.insert(), rows)


def test_a_view_given_the_last_views_jobs_reads_what_changed_since(tmp_path: Path) -> None:
    """The running jobs kept from the last view (``kept``) stand for their rows only while those read the same."""
    home = tmp_path / "home"
    home.mkdir()
    store = _seed(home, 0, seed=5)
    try:
        engine = _engine(home, store)
        kept: dict[str, Running] = {}
        first = RunningView(engine.parts, engine.jobs.cadence, engine.jobs.reviewer, {}, kept)
        assert first.running and kept == first.running
        changed = sorted(first.running)[0]
        with store.transaction() as s:
            cluster = s.get(ClusterRow, first.running[changed].cluster.id)
            assert cluster is not None
            cluster.handle = {**(cluster.handle or {}), "moved": True}
        again = RunningView(engine.parts, engine.jobs.cadence, engine.jobs.reviewer, {}, kept)
        fresh = RunningView(engine.parts, engine.jobs.cadence, engine.jobs.reviewer, {})
        assert again.running == fresh.running
        assert again.running[changed].cluster.handle.get("moved") is True
        same = [j for j in again.running if first.running[j].cluster.id != first.running[changed].cluster.id]
        assert same and all(again.running[j] is first.running[j] for j in same)
    finally:
        store.dispose()
