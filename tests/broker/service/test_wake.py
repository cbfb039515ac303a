"""The leader's engine steps on what happened (``broker.service.wake``): a new job, a notice, an agent's
report, a job under way, the market's next tick; and not otherwise."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from broker.config.settings import load_settings
from broker.model import JobState
from broker.notices.record import Notice, record_notice
from broker.runtime import Runtime, assemble
from broker.service import tasks
from broker.service.wake import StepGate, Wake, listen_for_writes, watch_writes
from broker.spec.job import parse_job_spec
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow, ProgressRow

JOB = "name: w\nresources:\n  accelerators: V100:1\nrun: 'true'\n"


class Ticks:
    """The gate's monotonic time, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def runtime(db_url: str, tmp_path: Path) -> Iterator[Runtime]:
    built = assemble(load_settings(home=tmp_path / "home", db_url=db_url), fresh_market=True)
    built.store.migrate()
    try:
        yield built
    finally:
        built.close()


def _quiet(gate: StepGate) -> None:
    """A step that wrote nothing: the gate remembers the store as it is now."""
    *_, before = gate.read()
    gate.stepped(before)


def test_an_idle_engine_steps_only_when_something_happens(runtime: Runtime) -> None:
    ticks = Ticks()
    gate = StepGate(runtime.store, runtime.clock, runtime.market, heartbeat_s=30.0, monotonic=ticks)
    assert gate.should_step()  # never stepped yet
    _quiet(gate)
    assert not gate.should_step()

    (job_id,) = runtime.submit(parse_job_spec(JOB, source=str(runtime.settings.home / "w.yaml"), offline=True))
    assert gate.should_step()  # a new job
    *_, before = gate.read()
    with runtime.store.transaction() as s:  # the step itself wrote something: step again
        s.add(ProgressRow(job_id=job_id, attempt=1, step=1, at=runtime.clock.now()))
    gate.stepped(before)
    assert gate.should_step()
    _quiet(gate)
    assert not gate.should_step()

    _ended_cluster(runtime, "c1")
    record_notice(runtime.store, runtime.clock, Notice("c1", "terminate"), source="agent")
    assert gate.should_step()  # a notice, through any replica
    _quiet(gate)
    assert not gate.should_step()

    ticks.now += 31.0  # the heartbeat (or the market's next tick) has come
    assert gate.should_step()
    _quiet(gate)
    assert not gate.should_step()

    with runtime.store.transaction() as s:  # a job running: its backend is asked every WATCH_S
        job = s.get(JobRow, job_id)
        assert job is not None
        job.state = JobState.RUNNING.value
    _quiet(gate)
    assert not gate.should_step()
    ticks.now += gate.watch_s + 0.01
    assert gate.should_step()

    with runtime.store.transaction() as s:  # a job in flight: asked every tick
        job = s.get(JobRow, job_id)
        assert job is not None
        job.state = JobState.PROVISIONING.value
    _quiet(gate)
    assert gate.should_step()


def test_the_next_market_tick_is_a_timer(runtime: Runtime) -> None:
    ticks = Ticks()
    gate = StepGate(runtime.store, runtime.clock, runtime.market, heartbeat_s=10_000.0, monotonic=ticks)
    _quiet(gate)
    assert not gate.should_step()
    tick = runtime.market.tick_seconds
    assert tick
    ticks.now += tick / runtime.clock.speed + 1.0  # past the next tick, whenever in the tick we were
    assert gate.should_step()


def _ended_cluster(runtime: Runtime, cluster_id: str, store: Store | None = None) -> None:
    with (store or runtime.store).transaction() as s:
        _ended_cluster_in(s, cluster_id, runtime.clock.now())


def _ended_cluster_in(s: Session, cluster_id: str, at: datetime | None = None) -> None:
    s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, backend="local", cloud="aws", region="us-east-1",
                     zone="us-east-1a", instance_type="p3.2xlarge", accelerator="V100", gpus_per_node=1,
                     num_nodes=1, spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0,
                     state="TERMINATED", created_at=at or datetime.now(UTC), handle={}))


class Leading:
    """A replica leading, as ``tasks`` sees it: the real engine and gate, over the real store."""

    def __init__(self, runtime: Runtime, gate: StepGate) -> None:
        self.settings = runtime.settings
        self.work_store = runtime.store
        self.engine = runtime.engine(None)
        self.step_gate = gate
        self.steps = 0
        step = self.engine.step

        def counted() -> None:
            self.steps += 1
            step()

        self.engine.step = counted  # type: ignore[method-assign]

    def confirm_leadership(self) -> bool:
        return True


def test_the_scheduled_step_skips_while_nothing_happens(runtime: Runtime) -> None:
    ticks = Ticks()
    leading = Leading(runtime, StepGate(runtime.store, runtime.clock, runtime.market, heartbeat_s=1e6,
                                        monotonic=ticks))
    ticks.now = -1e9  # the market's tick timer never comes due in this test
    tasks.bind(leading)  # type: ignore[arg-type]
    try:
        tasks.engine_step()
        assert leading.steps == 1
        for _ in range(5):
            tasks.engine_step()
        assert leading.steps == 1
        _ended_cluster(runtime, "gone")
        tasks.engine_step()
        assert leading.steps == 1  # a cluster row alone is no event
        record_notice(runtime.store, runtime.clock, Notice("gone", "terminate"), source="agent")
        tasks.engine_step()
        assert leading.steps == 2
    finally:
        tasks.bind(None)


def test_with_a_wake_a_tick_reads_the_store_only_after_a_write_or_when_due(runtime: Runtime, db_url: str) -> None:
    """Writes committed through this process wake the gate at once; reads do not; what another process
    writes is read within ``remote_s``; a write rolled back wakes nothing."""
    ticks = Ticks()
    wake = Wake()
    stop = watch_writes(runtime.store, wake)
    gate = StepGate(runtime.store, runtime.clock, runtime.market, heartbeat_s=1e6, monotonic=ticks, wake=wake,
                    remote_s=2.0)
    ticks.now = -1e9  # the market's tick timer never comes due in this test
    reads: list[str] = []
    event.listen(runtime.store.engine, "before_cursor_execute", lambda *a: reads.append(a[2]))
    try:
        assert gate.should_step()  # never stepped yet
        _quiet(gate)
        wake.take()  # what the test wrote before
        reads.clear()
        for _ in range(5):
            assert not gate.should_step()
        assert reads == []  # nothing written, nothing due: not one statement
        with runtime.store.transaction() as s:
            s.scalars(select(JobRow)).all()
        reads.clear()
        assert not gate.should_step() and reads == []  # a read-only transaction wakes nothing

        with pytest.raises(RuntimeError), runtime.store.transaction() as s:
            _ended_cluster_in(s, "rolled")
            s.flush()
            raise RuntimeError("rolled back")
        reads.clear()
        assert not gate.should_step() and reads == []

        (job_id,) = runtime.submit(parse_job_spec(JOB, source=str(runtime.settings.home / "w.yaml"), offline=True))
        assert gate.should_step()  # written through this process: read at the next tick
        _quiet(gate)
        wake.take()
        assert not gate.should_step()

        other = open_store(db_url)  # another replica, or a command on the same store
        try:
            _ended_cluster(runtime, "c-elsewhere", store=other)
            record_notice(other, runtime.clock, Notice("c-elsewhere", "terminate"), source="agent")
        finally:
            other.dispose()
        assert not wake.take()
        assert not gate.should_step()  # not read yet
        ticks.now += 2.01
        assert gate.should_step()  # read within remote_s
        _quiet(gate)
        wake.take()

        with runtime.store.transaction() as s:  # a job in flight: the store is read every tick
            job = s.get(JobRow, job_id)
            assert job is not None
            job.state = JobState.PROVISIONING.value
        _quiet(gate)
        wake.take()
        reads.clear()
        assert gate.should_step() and gate.should_step()
        assert len(reads) == 2
    finally:
        stop()


def test_on_postgresql_another_replicas_write_wakes_the_leader(runtime: Runtime, db_url: str) -> None:
    """A replica's writing transaction notifies the leader's listener as it commits; a read does not."""
    if runtime.store.dialect != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's; on SQLite the gate reads the store every remote_s")
    wake = Wake()
    unlisten = listen_for_writes(runtime.store, wake)
    other = open_store(db_url)
    stop = watch_writes(other, Wake())
    try:
        assert _woken(wake)  # the listener, once listening, wakes the gate for what came before
        with other.transaction() as s:
            s.scalars(select(JobRow)).all()
        time.sleep(0.5)
        assert not wake.take()  # a read notifies nothing
        _ended_cluster(runtime, "c-other", store=other)
        assert _woken(wake)
        record_notice(other, runtime.clock, Notice("c-other", "terminate"), source="agent")
        assert _woken(wake)
    finally:
        stop()
        unlisten()
        other.dispose()


def _woken(wake: Wake, within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if wake.take():
            return True
        time.sleep(0.05)
    return False
