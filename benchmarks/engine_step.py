"""The engine's step against the size of the queue and of the running fleet: time, SQL statements and
transactions per step.

    python benchmarks/engine_step.py [--queued 10,100,1000] [--running 10] [--steps 5] [--seed-running]
                                     [--baseline-max 1000] [--postgres postgresql://USER@HOST:5432/postgres]

For each queue size N it builds a fresh embedded broker (the local backend, its store on SQLite, or
with ``--postgres`` on a fresh database created on that server and dropped after) with ``--running``
jobs RUNNING and the pool capped at their GPUs (``max_gpus``), queues N more jobs behind that cap
(stored at once, as a backlog arriving) and drives ``Engine.step()`` in-process:

- ``new:first``: the first step after the N jobs arrive (every queued job is new to the engine: the
  batch a change of capacity costs; the running jobs' places are reviewed too, once per market tick);
- ``new:tick`` (seeded runs): the first step after the market's next tick, which reviews every
  running job's place once (the selection policy asked for each);
- ``new:steady``: ``--steps`` steps in which nothing changes (median and p95);
- ``new:minute`` (seeded runs): the first step after a market minute ends, which meters that minute
  (of ``metering.PER_STEP`` clusters at most: the rest in the steps after it);
- a notice's time to act: a termination notice recorded for one running cluster, then the notices'
  lane a step begins with (``Engine.act_on_notices``), timed until that job is CHECKPOINTING, and
  the rest of that step;
- notices that arrive during a step (recorded by another thread 0.2 s into a step, after the lane
  the step begins with has looked, and half a quiet step into one, as the service's API records an
  agent's report), each timed from its arrival until that job is CHECKPOINTING;
- statements (SQLAlchemy ``before_cursor_execute``) and transactions (``begin``) per step, which do
  not depend on the machine.

The running jobs are started for real (a local cluster each: a host process and an agent per node)
or, with ``--seed-running``, written straight into the store (a spot cluster each, UP, with its
allocation) and into the local cloud's files as its hosts and agents write them, one process
standing in for all of them: the engine reads the store and asks the backend exactly as it does for
jobs it started itself, and thousands of running jobs fit a small machine. Seeded runs play the
market at wall speed (a tick a minute), so steady steps fall between ticks.

Baseline, measured in the same run on the same store: the same steps by an engine built with
``queue_fast_path=False``, which takes every queued and every running job through the full decision
on every pass, as the engine did before (skipped above ``--baseline-max`` queued jobs, where one step
takes minutes; its statements grow linearly, so the printed slope says what it would cost).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import logging  # noqa: E402

from sqlalchemy import event, select  # noqa: E402

from broker.backends.local.claims import identity  # noqa: E402
from broker.config.settings import load_settings  # noqa: E402
from broker.engine import Engine  # noqa: E402
from broker.engine.machine import submit_jobs  # noqa: E402
from broker.engine.notices import record_backend_notice  # noqa: E402
from broker.engine.parts import cluster_info  # noqa: E402
from broker.engine.step import freeze_long_lived  # noqa: E402
from broker.model import JobState  # noqa: E402
from broker.runtime import Runtime, assemble  # noqa: E402
from broker.spec.job import parse_job_spec  # noqa: E402
from broker.store.tables import AllocationRow, ClusterRow, JobRow  # noqa: E402
from providers.base import SpotQuote  # noqa: E402
from providers.trace import write_trace  # noqa: E402

GPUS_PER_NODE = 4
MID_STEP_S = 0.2  # when a notice arrives during a step: after the lane the step begins with has looked
JOB = """\
name: {name}
resources:
  accelerators: V100:4
run: sleep 100000
broker:
  priority: {priority}
"""


@dataclass
class Count:
    statements: int = 0
    transactions: int = 0


@dataclass
class Figures:
    seconds: list[float]
    statements: list[int]
    transactions: list[int]

    def line(self, label: str) -> str:
        p95 = statistics.quantiles(self.seconds, n=20)[-1] if len(self.seconds) >= 2 else self.seconds[0]
        return (f"{label:<10} {statistics.median(self.seconds):9.3f} {p95:9.3f} "
                f"{statistics.median(self.statements):11.0f} {statistics.median(self.transactions):8.0f}")


def counting(engine: Any) -> Count:
    count = Count()

    def statement(*_: Any) -> None:
        count.statements += 1

    def begin(*_: Any) -> None:
        count.transactions += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "begin", begin)
    return count


def measure(step: Callable[[], None], count: Count, repeat: int) -> Figures:
    figures = Figures([], [], [])
    for _ in range(repeat):
        before = (count.statements, count.transactions)
        started = time.perf_counter()
        step()
        figures.seconds.append(time.perf_counter() - started)
        figures.statements.append(count.statements - before[0])
        figures.transactions.append(count.transactions - before[1])
    return figures


def market(path: Path, nodes: int, tick_minutes: int = 1) -> Path:
    origin = datetime(2026, 1, 1, tzinfo=UTC)
    write_trace(path, [SpotQuote("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", GPUS_PER_NODE, 3.67, 12.24,
                                 origin + timedelta(minutes=m), available_nodes=nodes)
                       for m in range(0, 24 * 60, tick_minutes)])
    return path


def states(engine: Engine) -> dict[str, int]:
    with engine.store.transaction() as s:
        found: dict[str, int] = {}
        for state in s.scalars(select(JobRow.state)):
            found[state] = found.get(state, 0) + 1
        return found


def submit(engine: Engine, home: Path, count: int, prefix: str, priority: str) -> list[str]:
    """``count`` jobs alike: the first through the engine's intake (judged against the market), the
    rest stored with it in batches of a thousand, as a backlog arriving at once."""
    spec = parse_job_spec(JOB.format(name=f"{prefix}", priority=priority), source=str(home / f"{prefix}.yaml"))
    if count == 0:
        return []
    job_ids = [engine.submit(spec)]
    for start in range(1, count, 1000):
        job_ids += submit_jobs(engine.store, engine.clock, [spec] * min(1000, count - start), engine.options.home,
                               engine.provisioner.name)
    return job_ids


@contextlib.contextmanager
def database(server: str | None) -> Iterator[str | None]:
    """A fresh PostgreSQL database on ``server`` (an admin URL), dropped afterwards; None: SQLite."""
    if server is None:
        yield None
        return
    import psycopg

    name = f"engine_step_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def broker(home: Path, running: int, db_url: str | None, seeded: bool) -> Iterator[tuple[Runtime, Engine]]:
    home.mkdir(parents=True, exist_ok=True)
    # Seeded runs never provision (but for the notice's replacement): a market minute is a wall minute.
    # (and its market ticks every 5 minutes, as often as a live market's running jobs are reviewed)
    settings = load_settings(home=home, market=market(home / "market.csv", running + 2, 5 if seeded else 1),
                             speed=1.0 if seeded else 60.0,
                             local_provision_seconds=60.0, max_gpus=running * GPUS_PER_NODE, pool_idle_seconds=0.0,
                             db_url=db_url)
    runtime = assemble(settings, fresh_market=True)
    engine = runtime.start()
    try:
        yield runtime, engine
    finally:
        from broker.engine import machine

        if seeded:  # tear down only what the engine launched itself (the notice's replacement)
            with engine.store.transaction() as s:
                for row in s.scalars(select(ClusterRow).where(ClusterRow.launch_key != ClusterRow.id)):
                    engine.provisioner.terminate(cluster_info(row))
        else:
            for job_id in engine.active_jobs():
                machine.cancel_job(engine.store, job_id, engine.clock)
            for _ in range(3):
                engine.step()
        runtime.close()


@contextlib.contextmanager
def stand_in() -> Iterator[int]:
    """One process standing in for every seeded cluster's host and every node's agent."""
    process = subprocess.Popen(["sleep", "100000"], start_new_session=True)
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def seed_running(engine: Engine, home: Path, count: int, pid: int) -> list[str]:
    """``count`` jobs RUNNING, each on a spot cluster of its own that is UP, written straight into the
    store and into the local cloud's files as its hosts and agents write them (``pid`` standing in for
    all of them), so the engine reads and asks the backend exactly as for jobs it started itself."""
    job_ids = submit(engine, home, count, "running", "training")
    now = engine.clock.now()
    root = home / "local" / "clusters"
    with engine.store.transaction() as s:
        for job_id in job_ids:
            cluster_id = f"{job_id}-seeded"
            directory = root / cluster_id
            run = directory / "runs" / f"{job_id}-1"
            (run / "node-0").mkdir(parents=True)
            (directory / "cluster.json").write_text(json.dumps({"cluster_id": cluster_id}))
            (directory / "status.json").write_text(json.dumps({"state": "UP", "host_pid": pid, "metadata_port": 1}))
            (run / "gang.json").write_text(json.dumps({"nodes": 1, **identity(pid)}))
            (run / "node-0" / "started").write_text(json.dumps(identity(pid)))
            s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, job_id=job_id, backend="local", cloud="aws",
                             region="us-east-1", zone="us-east-1a", instance_type="p3.8xlarge", accelerator="V100",
                             gpus_per_node=GPUS_PER_NODE, num_nodes=1, spot=True, price_per_node_hour=3.67,
                             on_demand_price_per_node_hour=12.24, state="UP", created_at=now, up_at=now,
                             metered_until=now, handle={"metadata_port": 1, "dir": str(directory)}))
        s.flush()
        for job in s.scalars(select(JobRow).where(JobRow.id.in_(job_ids))):
            job.state, job.attempt, job.zones, job.started_at = JobState.RUNNING.value, 1, ["us-east-1a"], now
            s.add(AllocationRow(job_id=job.id, cluster_id=f"{job.id}-seeded", attempt=1,
                                gpus={"0": list(range(GPUS_PER_NODE))}, started_at=now, running_at=now))
    return job_ids


def start_running(engine: Engine, home: Path, count: int) -> list[str]:
    """``count`` jobs started for real: a local cluster each, a host process and an agent per node."""
    job_ids = submit(engine, home, count, "running", "training")
    deadline = time.time() + 300
    while states(engine).get("RUNNING", 0) < count:
        if time.time() > deadline:
            raise SystemExit(f"the {count} running jobs did not start: {states(engine)}")
        engine.step()
        time.sleep(0.1)
    return job_ids


def seed_first_look(engine: Engine, job_ids: list[str]) -> None:
    """What a queued job's first look writes when the pool is full (``fleet_full``, through the engine's
    own writer), for every job of the backlog at once: the steps measured are those after it."""
    from broker.engine.clusters import record_blocked

    for start in range(0, len(job_ids), 1000):
        with engine.store.transaction() as s:
            for job in s.scalars(select(JobRow).where(JobRow.id.in_(job_ids[start:start + 1000]))):
                record_blocked(engine.parts, s, job, "fleet_full", max_gpus=engine.options.max_gpus)


def one_size(queued: int, running: int, steps: int, baseline: bool, server: str | None, seeded: bool) -> list[str]:
    lines = []
    with tempfile.TemporaryDirectory(prefix="engine-step-") as tmp, database(server) as db_url, \
            stand_in() as pid:
        home = Path(tmp) / "home"
        with broker(home, running, db_url, seeded) as (runtime, engine):
            count = counting(engine.store.engine)
            first = seed_running(engine, home, running, pid) if seeded else start_running(engine, home, running)
            waiting = submit(engine, home, queued, "queued", "training")
            if seeded:
                seed_first_look(engine, waiting)
            new = measure(engine.step, count, 1)
            lines.append(new.line("new:first"))
            freeze_long_lived()  # as the service and the foreground engine do after their first step
            steady = measure(engine.step, count, steps)
            lines.append(steady.line("new:steady"))
            if seeded:  # the first step after a market minute ends: the ledger meters every cluster's minute
                now = engine.clock.now()
                time.sleep(max(((now.replace(second=0, microsecond=0) + timedelta(minutes=1)) - now).total_seconds()
                               / engine.clock.speed, 0.0) + 0.5)
                lines.append(measure(engine.step, count, 1).line("new:minute"))
            if baseline:
                old = runtime.engine(engine.options.broker_url, queue_fast_path=False)
                old_steady = measure(old.step, count, max(1, min(steps, 3 if queued <= 100 else 1)))
                lines.append(old_steady.line("old:steady"))
            assert states(engine).get("PENDING", 0) == queued, states(engine)
            # A notice: recorded for one running cluster, acted on by the next step.
            with engine.store.transaction() as s:
                alloc = s.scalar(select(AllocationRow).where(AllocationRow.job_id == first[0],
                                                             AllocationRow.ended_at.is_(None)))
                assert alloc is not None
                cluster_id = alloc.cluster_id
            record_backend_notice(engine.store, engine.clock, cluster_id, engine.clock.now() + timedelta(minutes=2))
            started = time.perf_counter()
            engine.act_on_notices()  # the lane a step begins with
            lane = time.perf_counter() - started
            engine.step()
            acted = time.perf_counter() - started
            with engine.store.transaction() as s:
                state = s.get(JobRow, first[0]).state  # type: ignore[union-attr]
            lines.append(f"notice acted on in {lane:.3f} s by the step's notice lane, "
                         f"{acted:.3f} s with the rest of the step (job {state})")
            assert state == JobState.CHECKPOINTING.value, state
            # Notices that arrive while a step runs: just after the lane it begins with looked, and half a
            # quiet step into it (after the running jobs' view was read, on a long step).
            for job_id, delay in zip(first[1:3], (MID_STEP_S, statistics.median(steady.seconds) / 2), strict=False):
                waited, step_s = notice_mid_step(engine, job_id, delay)
                lines.append(f"notice arriving {delay:.3f} s into a step of {step_s:.3f} s acted on "
                             f"{waited:.3f} s after it arrived")
    return lines


def cluster_of(engine: Engine, job_id: str) -> str:
    with engine.store.transaction() as s:
        alloc = s.scalar(select(AllocationRow).where(AllocationRow.job_id == job_id, AllocationRow.ended_at.is_(None)))
        assert alloc is not None
        return alloc.cluster_id


def notice_mid_step(engine: Engine, job_id: str, delay: float) -> tuple[float, float]:
    """A termination notice recorded for the job's cluster by another thread ``delay`` s into a step (as
    the service's API records an agent's report); the seconds from then until the job is CHECKPOINTING
    (the next step is run at once if this one ends first), and that step's length."""
    cluster_id = cluster_of(engine, job_id)
    waited: list[float] = []

    def notice() -> None:
        time.sleep(delay)
        record_backend_notice(engine.store, engine.clock, cluster_id, engine.clock.now() + timedelta(minutes=2))
        arrived = time.perf_counter()
        while time.perf_counter() - arrived < 600:
            with engine.store.transaction() as s:
                if s.scalar(select(JobRow.state).where(JobRow.id == job_id)) == JobState.CHECKPOINTING.value:
                    waited.append(time.perf_counter() - arrived)
                    return
            time.sleep(0.02)

    poller = threading.Thread(target=notice, daemon=True)
    started = time.perf_counter()
    poller.start()
    engine.step()
    step_s = time.perf_counter() - started
    while poller.is_alive():
        engine.step()  # the notice came after this step last looked: the next step's lane acts on it
        poller.join(timeout=0.05)
    assert waited, "the notice was not acted on"
    return waited[0], step_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", default="10,100,1000")
    parser.add_argument("--running", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--baseline-max", type=int, default=1000)
    parser.add_argument("--seed-running", action="store_true",
                        help="write the running jobs straight into the store and the local cloud's files, one process "
                             "standing in for every host and agent (thousands of running jobs on a small machine)")
    parser.add_argument("--postgres", default=None,
                        help="a PostgreSQL admin URL: each size gets a fresh database there (default: SQLite)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: tear down what it started, then go
    logging.getLogger("broker").setLevel(logging.WARNING)
    sizes = [int(n) for n in args.queued.split(",")]
    print(f"{args.running} running ({'seeded' if args.seed_running else 'started'}), "
          f"store {'SQLite' if args.postgres is None else 'PostgreSQL'}, load average {load()}")
    print(f"{'queued':>7} {'path':<10} {'median s':>9} {'p95 s':>9} {'statements':>11} {'txns':>8}")
    for n in sizes:
        for line in one_size(n, args.running, args.steps, n <= args.baseline_max, args.postgres, args.seed_running):
            print(f"{n:>7} {line}", flush=True)
        print(f"load average {load()}", flush=True)


def load() -> str:
    """The machine's load (1, 5 and 15 minutes): times here depend on it, statements do not."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
