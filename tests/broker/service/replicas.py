"""Start `broker serve` replicas as real processes, and wait on what they say."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg

from providers.base import SpotQuote
from providers.trace import write_trace

ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")


def libpq_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return "postgresql://" + rest if scheme.startswith("postgresql") else url


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def two_zone_trace(path: Path, cheap_lost_from: int = 15, cheap_lost_until: int = 90, ticks: int = 180) -> Path:
    """A V100 market: aws us-east-1a (cheap) loses its capacity from minute ``cheap_lost_from``; gcp keeps its."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    quotes = []
    for tick in range(ticks):
        when = start + timedelta(minutes=tick)
        lost = cheap_lost_from <= tick < cheap_lost_until
        quotes.append(SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.9, 3.06, when,
                                available_nodes=0 if lost else 2))
        quotes.append(SpotQuote("gcp", "us-central1", "us-central1-a", "n1-highmem-8", "V100", 1, 1.0, 2.95, when,
                                available_nodes=2))
    write_trace(path, quotes)
    return path


def flapping_trace(path: Path, up: int = 30, down: int = 15, ticks: int = 1800) -> Path:
    """Like ``two_zone_trace``, but the cheap zone loses its capacity for ``down`` minutes of every ``up + down``.

    Preemptions then come all through a run, however long its replicas take to start.
    """
    start = datetime(2026, 1, 1, tzinfo=UTC)
    quotes = []
    for tick in range(ticks):
        when = start + timedelta(minutes=tick)
        lost = tick % (up + down) >= up
        quotes.append(SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.9, 3.06, when,
                                available_nodes=0 if lost else 2))
        quotes.append(SpotQuote("gcp", "us-central1", "us-central1-a", "n1-highmem-8", "V100", 1, 1.0, 2.95, when,
                                available_nodes=2))
    write_trace(path, quotes)
    return path


@dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def health(self) -> dict[str, Any] | None:
        try:
            return httpx.get(f"{self.url}/v1/health", timeout=2).json()  # type: ignore[no-any-return]
        except httpx.HTTPError:
            return None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def spawn_replica(name: str, env: dict[str, str], directory: Path, *args: str) -> Replica:
    """Start a replica and return at once (it takes a few seconds to serve)."""
    port = free_port()
    log = directory / f"{name}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen([sys.executable, "-m", "broker", "serve", "--port", str(port), *args], cwd=ROOT,
                                   env={**os.environ, **env}, stdout=handle, stderr=handle,
                                   stdin=subprocess.DEVNULL)
    return Replica(name, port, process, log, env)


def start_replica(name: str, env: dict[str, str], directory: Path, *args: str) -> Replica:
    replica = spawn_replica(name, env, directory, *args)
    wait_for(lambda: replica.health(), timeout=120, what=f"{name} to serve (log: {replica.log.read_text()[-2000:]})")
    return replica


def leader_of(replicas: list[Replica]) -> Replica | None:
    return next((r for r in replicas if r.process.poll() is None and (r.health() or {}).get("leader")), None)


# --- what the database saw: every write to the engine's tables, with the epoch of its transaction ---

AUDITED = ("jobs", "job_events", "clusters", "allocations", "notices", "ledger")


def install_write_audit(postgres_url: str) -> None:
    """Triggers that log each row written (and each change of the lease) with its transaction's epoch.

    A fenced transaction names its epoch to the server (``broker.epoch``); the log is written in the
    same transaction, so a write the fence refused leaves no line, and one it let through cannot hide.
    """
    with psycopg.connect(libpq_url(postgres_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE write_audit (id bigserial PRIMARY KEY, tbl text, op text, epoch int,"
                     " holder text, ts timestamptz)")
        conn.execute("""CREATE FUNCTION audit_write() RETURNS trigger AS $$ BEGIN
            INSERT INTO write_audit (tbl, op, epoch, ts) VALUES (TG_TABLE_NAME, TG_OP,
                nullif(current_setting('broker.epoch', true), '')::int, clock_timestamp());
            RETURN NULL; END $$ LANGUAGE plpgsql""")
        conn.execute("""CREATE FUNCTION audit_lease() RETURNS trigger AS $$ BEGIN
            INSERT INTO write_audit (tbl, op, epoch, holder, ts)
                VALUES ('leader_lease', TG_OP, NEW.epoch, NEW.holder, clock_timestamp());
            RETURN NULL; END $$ LANGUAGE plpgsql""")
        for table in AUDITED:
            conn.execute(f"CREATE TRIGGER audit_{table} AFTER INSERT OR UPDATE OR DELETE ON {table}"
                         " FOR EACH ROW EXECUTE FUNCTION audit_write()")
        conn.execute("CREATE TRIGGER audit_lease AFTER UPDATE ON leader_lease"
                     " FOR EACH ROW EXECUTE FUNCTION audit_lease()")


@dataclass(frozen=True)
class AuditedWrite:
    tbl: str
    op: str
    epoch: int | None
    holder: str | None
    ts: datetime


def audited_writes(postgres_url: str) -> list[AuditedWrite]:
    with psycopg.connect(libpq_url(postgres_url), autocommit=True) as conn:
        rows = conn.execute("SELECT tbl, op, epoch, holder, ts FROM write_audit ORDER BY id").fetchall()
    return [AuditedWrite(*row) for row in rows]


def lease_changes(writes: list[AuditedWrite]) -> dict[int, tuple[datetime, datetime | None]]:
    """epoch -> (when it was taken, when it was released or taken over: the first change naming another)."""
    spans: dict[int, tuple[datetime, datetime | None]] = {}
    current: int | None = None
    for write in (w for w in writes if w.tbl == "leader_lease"):
        if write.holder is not None and write.epoch not in spans:
            if current is not None and spans[current][1] is None:
                spans[current] = (spans[current][0], write.ts)
            spans[write.epoch] = (write.ts, None)  # type: ignore[index]
            current = write.epoch
        elif write.holder is None and current is not None and spans[current][1] is None:
            spans[current] = (spans[current][0], write.ts)
    return spans


def late_writes(writes: list[AuditedWrite]) -> list[AuditedWrite]:
    """Engine writes committed by an epoch after its lease was released or taken over: must be none."""
    spans = lease_changes(writes)
    return [w for w in writes if w.tbl != "leader_lease" and w.epoch is not None
            and spans.get(w.epoch, (w.ts, None))[1] is not None and w.ts >= spans[w.epoch][1]]  # type: ignore[operator]


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.1) -> T:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# --- a fleet of replicas running a queue, and the faults the failover tests and benchmark inject ---

JOB = """\
name: {name}
num_nodes: 1
resources:
  accelerators: V100:1
workdir: {workdir}
run: python train.py --steps {steps} --step-seconds 0.05 --checkpoint-every 40
"""
FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")


class Fleet:
    """``broker serve`` replicas sharing one broker home and one PostgreSQL, with the store at hand."""

    def __init__(self, directory: Path, home: Path, postgres_url: str, market: Path, **settings: str) -> None:
        from broker.store import open_store
        from broker.tokens import create_api_token

        self.directory = directory
        self.home = home
        self.postgres_url = postgres_url
        self.env = {"BROKER_HOME": str(home), "BROKER_DB_URL": postgres_url, "BROKER_MARKET": str(market),
                    "BROKER_SPEED": "60", "BROKER_LOCAL_PROVISION_SECONDS": "60", "BROKER_POLL_SECONDS": "0.2",
                    "BROKER_OFFLINE_CATALOG": "true",
                    **settings}
        self.store = open_store(postgres_url)
        install_write_audit(postgres_url)
        self.token = create_api_token(self.store, "research").token
        self.replicas: list[Replica] = []
        self.jobs: list[str] = []
        self._names = 0

    def spawn(self, *args: str) -> Replica:
        self._names += 1
        replica = spawn_replica(f"r{self._names}", self.env, self.directory, *args)
        self.replicas.append(replica)
        return replica

    def start(self, count: int, *args: str) -> list[Replica]:
        started = [self.spawn(*args) for _ in range(count)]
        for replica in started:
            wait_for(replica.health, 180, f"{replica.name} to serve")
        return started

    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.process.poll() is None]

    def leader(self, timeout: float = 120) -> Replica:
        return wait_for(lambda: leader_of(self.alive()), timeout, "a leader")

    def submit(self, steps: int = 200) -> str:
        spec = JOB.format(name=f"job-{len(self.jobs)}", workdir=ROOT / "examples", steps=steps)
        for replica in self.alive():  # any replica takes jobs; one may be starting or going
            try:
                response = httpx.post(f"{replica.url}/v1/jobs", json={"spec": spec}, timeout=180,
                                      headers={"Authorization": f"Bearer {self.token}"})
            except httpx.HTTPError:
                continue
            assert response.status_code == 201, response.text
            self.jobs.append(response.json()["job_id"])
            return self.jobs[-1]
        raise AssertionError("no replica took the job")

    def states(self) -> dict[str, str]:
        from sqlalchemy import select

        from broker.store.tables import JobRow

        with self.store.transaction() as s:
            return {job_id: state for job_id, state in s.execute(select(JobRow.id, JobRow.state))}

    def active(self) -> int:
        return sum(state not in FINISHED for state in self.states().values())

    def wait_finished(self, timeout: float) -> dict[str, str]:
        wait_for(lambda: self.active() == 0, timeout, "every job to finish", every=0.5)
        # The last teardowns (a loaded machine can take a while) and their last ledger minutes.
        wait_for(lambda: self.live_clusters() == 0 or None, 120, "every cluster to be torn down", every=0.5)
        time.sleep(2)
        return self.states()

    def live_clusters(self) -> int:
        from sqlalchemy import func, select

        from broker.store.tables import ClusterRow

        with self.store.transaction() as s:
            return int(s.scalar(select(func.count()).select_from(ClusterRow)
                                .where(ClusterRow.state.not_in(["TERMINATED", "FAILED"]))) or 0)

    def check(self) -> dict[str, Any]:
        """What the store and the local cloud show after the run: the counts that must be zero."""
        from sqlalchemy import select

        from broker.store.tables import AllocationRow, ClusterRow, LedgerRow
        from tests.ledger_checks import ledger_outside_cluster_life

        with self.store.transaction() as s:
            clusters = list(s.scalars(select(ClusterRow)))
            ledger = list(s.scalars(select(LedgerRow)))
            allocations = list(s.scalars(select(AllocationRow)))
        root = self.home / "local" / "clusters"
        dirs = {p.name for p in root.iterdir()} if root.is_dir() else set()
        # A job's node process started twice on one cluster (two leaders starting the same attempt).
        started_twice = 0
        for directory in (root / name for name in dirs):
            runs = list((directory / "runs").glob("*/node-*")) if (directory / "runs").is_dir() else []
            procs = list((directory / "procs").iterdir()) if (directory / "procs").is_dir() else []
            started_twice += max(len(procs) - len(runs), 0)
        live = [c.id for c in clusters if c.state not in ("TERMINATED", "FAILED")]
        return {
            "clusters": len(clusters),
            "clusters_without_row": len(dirs - {c.id for c in clusters}),
            "clusters_left_up": len(live),
            "jobs_started_twice": started_twice,
            "attempts": len(allocations),
            "ledger_rows": len(ledger),
            "ledger_violations": ledger_outside_cluster_life(clusters, ledger),
            "late_writes": late_writes(audited_writes(self.postgres_url)),
        }

    def close(self) -> None:
        for replica in self.replicas:
            if replica.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    replica.process.send_signal(signal.SIGCONT)
            replica.stop()
        root = self.home / "local" / "clusters"
        for directory in root.iterdir() if root.is_dir() else []:
            (directory / "terminate").touch()  # a run cut short leaves no local cluster host behind
        self.store.dispose()


@dataclass
class FaultRun:
    kind: str
    kills: int = 0
    takeovers: list[float] = field(default_factory=list)
    seconds: float = 0.0
    jobs: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)


def run_queue(fleet: Fleet, jobs: int, steps: int, timeout: float = 300) -> FaultRun:
    """The baseline: a queue run to the end with no fault."""
    began = time.time()
    fleet.leader()
    for _ in range(jobs):
        fleet.submit(steps)
    states = fleet.wait_finished(timeout)
    return FaultRun("none", seconds=time.time() - began, jobs=len(states),
                    finished=_count(states.values()), checks=fleet.check())


def chaos(fleet: Fleet, kills: int, rng: Any, steps: int = 200, timeout: float = 600,
          keep_active: int = 3, most_jobs: int = 40) -> FaultRun:
    """SIGKILL the leader at ``kills`` random moments while a queue with preemptions runs; restart each."""
    run = FaultRun("sigkill")
    began = time.time()
    for _ in range(keep_active):
        fleet.submit(steps)
    while run.kills < kills:
        assert time.time() - began < timeout, f"chaos run over {timeout:.0f} s"
        leader = fleet.leader()
        time.sleep(rng.uniform(0.2, 3.0))  # a random moment of whatever it is doing
        while fleet.active() < keep_active and len(fleet.jobs) < most_jobs:
            fleet.submit(steps)
        if leader.process.poll() is not None or not (leader.health() or {}).get("leader"):
            continue
        leader.process.send_signal(signal.SIGKILL)
        leader.process.wait()
        killed = time.time()
        run.kills += 1
        fleet.spawn()  # its replacement starts while the others take over
        fleet.leader(timeout=120)
        run.takeovers.append(time.time() - killed)
    states = fleet.wait_finished(timeout)
    run.seconds = time.time() - began
    run.jobs = len(states)
    run.finished = _count(states.values())
    run.checks = fleet.check()
    return run


def _count(states: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return counts
