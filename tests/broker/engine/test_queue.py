"""The queue's fast path (``broker.engine.queue``) passes over only the queued jobs the full decision
would leave as they are: on a seeded scenario, a pass over the queue writes exactly what the reference
path (every queued job through the full decision) writes, in the same order, in fewer statements."""

from __future__ import annotations

import random
import shutil
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, select

from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.engine import Engine, EngineOptions, machine
from broker.engine.queue import QueueView, Shapes
from broker.model import JobState
from broker.spec.job import JobSpec, Pipeline, parse_job_file, parse_job_spec
from broker.store import Store, open_store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, JobRow
from providers.base import SpotQuote
from providers.trace import write_trace

SHAPES = ("V100:1", "V100:2", "V100:4", "A100:8", "A100:2", "{A100:4, V100:4}")
CLASSES = ("batch", "training", "inference")
CLUSTERS = (("v1", "p3.8xlarge", "V100", 4), ("v2", "p3.8xlarge", "V100", 4), ("v3", "p3.8xlarge", "V100", 4),
            ("a1", "p4d.24xlarge", "A100", 8), ("a2", "p4d.24xlarge", "A100", 8))


def _market(path: Path) -> Path:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    quotes = []
    for m in range(120):
        at = start + timedelta(minutes=m)
        quotes.append(SpotQuote("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, 3.67, 12.24, at,
                                available_nodes=50))
        quotes.append(SpotQuote("aws", "us-east-1", "us-east-1b", "p4d.24xlarge", "A100", 8, 9.83, 32.77, at,
                                available_nodes=50))
    write_trace(path, quotes)
    return path


def _engine(home: Path, store: Store, **options: object) -> Engine:
    """An engine whose market clock stands still (a pass's decisions depend on the time)."""
    world = LocalWorld.load(home)
    assert world is not None
    provisioner = LocalProvisioner(home, world, 600.0)
    base = EngineOptions(home=home, max_gpus=sum(c[3] for c in CLUSTERS), restart_overhead_s=60.0)
    return Engine(store, world.clock, world.market(), provisioner, replace(base, **options),
                  tokens=lambda cluster_id: f"token-{cluster_id}")


def _spec(shape: str, priority: str, index: int, tmp: Path) -> JobSpec:
    text = f"name: q{index % 7}\nresources:\n  accelerators: {shape}\nrun: 'true'\nbroker:\n  priority: {priority}\n"
    return parse_job_spec(text, source=str(tmp / f"q{index}.yaml"), offline=True)


def _seed(home: Path, queued: int, seed: int, first_look_fast: bool = False) -> Store:
    """Clusters up, running gangs on them (some GPUs free), and ``queued`` jobs of mixed shapes and priorities,
    some of them pipeline stages; then one reference pass, so that every queued job has had its first look."""
    rng = random.Random(seed)
    LocalWorld.begin(home, str(_market(home / "market.csv")), 1e-9)
    store = open_store(f"sqlite:///{home / 'store.db'}")
    store.migrate()
    engine = _engine(home, store, queue_fast_path=False)
    now = engine.clock.now()
    with store.transaction() as s:
        for cid, instance, accelerator, gpus in CLUSTERS:
            s.add(ClusterRow(id=cid, launch_key=cid, backend="local", cloud="aws", region="us-east-1",
                             zone="us-east-1a" if accelerator == "V100" else "us-east-1b", instance_type=instance,
                             accelerator=accelerator, gpus_per_node=gpus, num_nodes=1, spot=True,
                             price_per_node_hour=3.67, on_demand_price_per_node_hour=12.24, state="UP",
                             created_at=now - timedelta(hours=1), up_at=now - timedelta(hours=1), handle={}))
    running = 0
    for cid, _, accelerator, gpus in CLUSTERS:
        gpu = 0
        while gpu < gpus - 1:
            size = min(rng.choice((1, 2)), gpus - gpu)
            job_id = engine.submit(_spec(f"{accelerator}:{size}", rng.choice(CLASSES), running, home))
            running += 1
            with store.transaction() as s:
                job = s.get(JobRow, job_id)
                assert job is not None
                job.state, job.attempt, job.work_s = JobState.RUNNING.value, 1, rng.choice((None, 600.0, 7200.0))
                s.add(AllocationRow(job_id=job_id, cluster_id=cid, attempt=1,
                                    gpus={"0": list(range(gpu, gpu + size))}, started_at=now - timedelta(minutes=30),
                                    running_at=now - timedelta(minutes=30)))
            gpu += size
    last: str | None = None
    for index in range(queued):
        spec = _spec(rng.choice(SHAPES), rng.choices(CLASSES, weights=(5, 10, 1))[0], index, home)
        if last is not None and rng.random() < 0.05:  # a chained stage behind the job queued before it
            job_ids = machine.submit_pipeline(store, engine.clock, _pipeline(home), home, "local")
            last = job_ids[-1]
        else:
            last = engine.submit(spec)
    _engine(home, store, queue_fast_path=first_look_fast).advance_all(engine.active_jobs(JobState.PENDING))
    return store


def _pipeline(home: Path) -> Pipeline:
    text = "name: a\nresources:\n  accelerators: V100:1\nrun: 'true'\n---\nname: b\nresources:\n" \
           "  accelerators: V100:1\nrun: 'true'\n"
    pipeline = parse_job_file(text, source=str(home / "pipeline.yaml"), offline=True)
    assert isinstance(pipeline, Pipeline)
    return pipeline


def _free_some(store: Store, seed: int) -> None:
    """Capacity changes: a few running gangs end."""
    rng = random.Random(seed + 1)
    with store.transaction() as s:
        running = list(s.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value).order_by(JobRow.id)))
        for job in rng.sample(running, 3):
            alloc = s.scalar(select(AllocationRow).where(AllocationRow.job_id == job.id))
            assert alloc is not None
            alloc.ended_at, alloc.outcome = alloc.started_at + timedelta(minutes=20), "succeeded"
            job.state = JobState.SUCCEEDED.value


def _copy(home: Path, to: Path) -> None:
    to.mkdir()
    source = sqlite3.connect(home / "store.db")
    target = sqlite3.connect(to / "store.db")
    source.backup(target)
    source.close()
    target.close()
    shutil.copytree(home / "local", to / "local")
    shutil.copy(home / "market.csv", to / "market.csv")


def _written(store: Store, since: int) -> list[tuple[str, str, str | None, object]]:
    with store.transaction() as s:
        rows = s.execute(select(JobEventRow.job_id, JobEventRow.kind, JobEventRow.to_state, JobEventRow.detail)
                         .where(JobEventRow.id > since).order_by(JobEventRow.id))
        return [(j, k, t, d) for j, k, t, d in rows]


def _pass(home: Path, fast: bool) -> tuple[list[tuple[str, str, str | None, object]], int, dict[str, str]]:
    store = open_store(f"sqlite:///{home / 'store.db'}")
    try:
        engine = _engine(home, store, queue_fast_path=fast)
        with store.transaction() as s:
            since = int(s.scalar(select(JobEventRow.id).order_by(JobEventRow.id.desc()).limit(1)) or 0)
        statements = [0]
        event.listen(store.engine, "before_cursor_execute", lambda *_: statements.__setitem__(0, statements[0] + 1))
        engine.advance_all(engine.active_jobs(JobState.PENDING))
        with store.transaction() as s:
            states = {job_id: state for job_id, state in s.execute(select(JobRow.id, JobRow.state))}
        return _written(store, since), statements[0], states
    finally:
        store.dispose()


def _same_decisions(tmp_path: Path, queued: int, seed: int, only_freed: bool = False) -> None:
    home = tmp_path / "seeded"
    home.mkdir()
    _seed(home, queued, seed, first_look_fast=only_freed).dispose()
    for freed in (True,) if only_freed else (False, True):
        if freed:
            store = open_store(f"sqlite:///{home / 'store.db'}")
            _free_some(store, seed)
            store.dispose()
        reference, fast = tmp_path / f"reference-{freed}", tmp_path / f"fast-{freed}"
        _copy(home, reference)
        _copy(home, fast)
        expected, slow_statements, expected_states = _pass(reference, fast=False)
        got, fast_statements, states = _pass(fast, fast=True)
        assert got == expected
        assert states == expected_states
        assert fast_statements < slow_statements, (fast_statements, slow_statements)
        if freed:  # the freed GPUs were taken, in order, and the rest still wait
            assert any(t == JobState.PROVISIONING.value for _, _, t, _ in got)
        shutil.rmtree(home)
        shutil.copytree(fast, home)


def test_a_pass_over_the_queue_decides_as_the_reference_path_does(tmp_path: Path) -> None:
    _same_decisions(tmp_path, 30, seed=7)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the reference path's pass costs a transaction or more per queued job
def test_a_pass_over_a_long_queue_decides_as_the_reference_path_does(tmp_path: Path) -> None:
    # 1,000 queued jobs, as the benchmark runs: the fast path's view spans many shapes,
    # priorities and stages at once (the whole test: 145 s on 2 shared cores at load 8-18).
    _same_decisions(tmp_path, 1000, seed=11, only_freed=True)


def test_the_view_says_which_queued_jobs_wait_and_why(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    store = _seed(home, 0, seed=3)
    try:
        engine = _engine(home, store)
        with store.transaction() as s:  # fill every GPU left, with batch gangs
            for cid, _, _, gpus in CLUSTERS:
                alloc = s.scalar(select(AllocationRow).where(AllocationRow.cluster_id == cid)
                                 .order_by(AllocationRow.id.desc()).limit(1))
                assert alloc is not None
                alloc.gpus = {"0": sorted({*alloc.gpus["0"], *range(max(alloc.gpus["0"]) + 1, gpus)})}
            for job in s.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value)):
                job.priority = 100
        batch = engine.submit(_spec("V100:4", "batch", 1, home))
        urgent = engine.submit(_spec("V100:4", "inference", 2, home))
        cpu = engine.submit(parse_job_spec("name: c\nrun: 'true'\n", source=str(home / "c.yaml"), offline=True))
        view = QueueView(engine.parts, Shapes(engine.parts))
        assert not view.may_place(batch) and not view.may_preempt(batch)
        assert not view.waits(batch)  # not yet told the pool is full: the full decision writes that once
        assert view.may_preempt(urgent) and not view.waits(urgent)
        assert not view.waits(cpu)  # no GPU limit holds a task without GPUs
        engine.advance_all([batch])
        view = QueueView(engine.parts, Shapes(engine.parts))
        assert view.waits(batch)
        with store.transaction() as s:  # one GPU of a V100 cluster frees up: the door opens
            alloc = s.scalar(select(AllocationRow).where(AllocationRow.cluster_id == "v1")
                             .order_by(AllocationRow.id.desc()).limit(1))
            assert alloc is not None
            alloc.ended_at = alloc.started_at
        view = QueueView(engine.parts, Shapes(engine.parts))
        assert view.may_place(batch) == (_free(store, "v1") >= 4)
    finally:
        store.dispose()


def _free(store: Store, cluster_id: str) -> int:
    with store.transaction() as s:
        held = sum(len(a.gpus["0"]) for a in s.scalars(select(AllocationRow).where(
            AllocationRow.cluster_id == cluster_id, AllocationRow.ended_at.is_(None))))
    return 4 - held


def test_a_view_kept_between_steps_reads_what_changed_since(tmp_path: Path) -> None:
    """What ``Shapes`` keeps from one view to the next (each queued job's row, open allocations' GPUs,
    last words on waiting) gives the next view what a fresh ``Shapes`` would read."""
    home = tmp_path / "home"
    home.mkdir()
    store = _seed(home, 40, seed=5)
    try:
        engine = _engine(home, store)
        kept = Shapes(engine.parts)
        first = QueueView(engine.parts, kept)
        assert first.queued
        with store.transaction() as s:  # a queued job's priority and nodes change, another leaves, GPUs free up
            changed, gone = sorted(first.queued)[:2]
            job = s.get(JobRow, changed)
            assert job is not None
            job.priority, job.num_nodes = job.priority + 1, job.num_nodes + 1
            job = s.get(JobRow, gone)
            assert job is not None
            job.state = JobState.CANCELLED.value
            alloc = s.scalar(select(AllocationRow).where(AllocationRow.ended_at.is_(None)).order_by(AllocationRow.id))
            assert alloc is not None
            alloc.ended_at = alloc.started_at
        engine.advance_all(engine.active_jobs(JobState.PENDING))  # writes new last words for some
        again, fresh = QueueView(engine.parts, kept), QueueView(engine.parts, Shapes(engine.parts))
        assert again.queued == fresh.queued and gone not in again.queued
        assert again.queued[changed] == fresh.queued[changed] != first.queued[changed]
        assert again.free == fresh.free and again.last_wait == fresh.last_wait
        assert [again.waits(j) for j in sorted(again.queued)] == [fresh.waits(j) for j in sorted(fresh.queued)]
    finally:
        store.dispose()
