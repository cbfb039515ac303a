"""When the leader's engine steps: on what happened, not on every tick of the scheduler.

The scheduler ticks every ``poll_seconds``; each tick asks ``StepGate.should_step`` first, which
reads the store once (one statement of a few ``max``/``exists`` subqueries) and says yes when:

- anything is in flight: a job provisioning, checkpointing or migrating, or a cluster coming up
  or being torn down (the backend must be asked how they fare, every tick);
- something happened since the last step, through any replica: a job event (a submission, a
  cancel, a state change), a notice, an agent's checkpoint, progress or GPU report, a new price
  quote, a time-based policy applied;
- the last step itself changed something (what it wrote may let the next step move further);
- the timer for the next thing due by time has run out: the market's next tick (prices move, a
  running job's place is reviewed, a launch back-off ends); ``WATCH_S`` while jobs run or clusters
  are up (a run's end is seen only by asking the backend: agents report notices, checkpoints and
  progress, but not that the job exited); otherwise ``HEARTBEAT_S`` at the latest.

Otherwise the tick ends after that one statement: a service with a long queue that certainly
waits, and nothing else, does next to nothing.

With a ``Wake`` (what ``broker serve``'s leader gives it), a tick does not even read the store unless
something may have changed: this process committed a write (``watch_writes``: an API request, an
agent's report, a scheduled job, the engine itself), something is in flight or the last step changed
something, a timer above is due, or ``REMOTE_S`` passed since the last read (what another process
wrote: a command on the same store). On PostgreSQL every replica's writing transactions also send
``NOTIFY broker_wake`` as they commit, and the leader listens (``listen_for_writes``), so a notice
taken by another replica wakes it at once too. A write through any replica is acted on at the next
tick, as before; one by another process on SQLite, within ``REMOTE_S`` plus a tick.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event, exists, func, select, text
from sqlalchemy.orm import ORMExecuteState, Session

from broker.clock import Clock
from broker.market.book import Market
from broker.model import ClusterState, JobState
from broker.store import Store
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import (
    CheckpointReportRow,
    ClusterRow,
    JobEventRow,
    JobRow,
    NoticeRow,
    PolicyOverrideRow,
    PriceQuoteRow,
    ProgressRow,
)

HEARTBEAT_S = 30.0  # wall seconds an idle engine goes without a step at most
WATCH_S = 5.0  # ... while jobs run or clusters are up: how late a run's end (or an idle cluster) may be seen
IN_FLIGHT = [JobState.PROVISIONING.value, JobState.CHECKPOINTING.value, JobState.MIGRATING.value]
FLUX = [ClusterState.PROVISIONING.value, ClusterState.TERMINATING.value]  # clusters coming up or going

REMOTE_S = 1.0  # wall seconds at most between two reads of the store while nothing is written here

Signature = tuple[object, ...]
WROTE = "broker.wake.wrote"  # in a session's ``info``: it wrote something, to be told at its commit
CHANNEL = "broker_wake"  # PostgreSQL's notification channel for writes


class Wake:
    """Set when this process commits a write to the store (``watch_writes``); taken by the gate's tick."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def take(self) -> bool:
        """Whether anything was written since the last take."""
        if not self._event.is_set():
            return False
        self._event.clear()
        return True


def watch_writes(store: Store, wake: Wake) -> Callable[[], None]:
    """Set ``wake`` at the commit of every transaction of ``store`` (and of its fenced views, which share
    its sessions) that wrote: a flush, or an insert, update or delete statement. Returns what stops it."""
    sessions = store._sessions

    def flushed(session: Session, _context: Any) -> None:
        session.info[WROTE] = True

    def executed(state: ORMExecuteState) -> None:
        if state.is_insert or state.is_update or state.is_delete:
            state.session.info[WROTE] = True

    notify = store.dialect == "postgresql"

    def committing(session: Session) -> None:
        # Before the commit's own flush: what it will write counts too.
        if notify and (session.info.get(WROTE) or session.new or session.dirty or session.deleted):
            session.execute(text(f"NOTIFY {CHANNEL}"))  # delivered at the commit, to every listener

    def committed(session: Session) -> None:
        if session.info.pop(WROTE, False):
            wake.set()

    def rolled_back(session: Session) -> None:
        session.info.pop(WROTE, None)

    hooks: list[tuple[str, Callable[..., None]]] = [("after_flush", flushed), ("do_orm_execute", executed),
                                                    ("before_commit", committing), ("after_commit", committed),
                                                    ("after_soft_rollback", lambda s, _t: rolled_back(s))]
    for name, hook in hooks:
        event.listen(sessions, name, hook)

    def stop() -> None:
        for name, hook in hooks:
            event.remove(sessions, name, hook)

    return stop


def listen_for_writes(store: Store, wake: Wake) -> Callable[[], None]:
    """On PostgreSQL, set ``wake`` whenever a transaction of any replica that wrote commits (their
    ``watch_writes`` notify ``CHANNEL``), from a connection of its own; elsewhere nothing. Returns
    what stops it."""
    if store.dialect != "postgresql":
        return lambda: None
    import psycopg

    dsn = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    stopped = threading.Event()

    def listen() -> None:
        while not stopped.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    wake.set()  # whatever was written while not listening
                    while not stopped.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            wake.set()
            except psycopg.Error:
                stopped.wait(1.0)  # the gate still reads the store every REMOTE_S meanwhile

    threading.Thread(target=listen, daemon=True, name="wake-listener").start()
    return stopped.set


class StepGate:
    def __init__(self, store: Store, clock: Clock, market: Market, heartbeat_s: float = HEARTBEAT_S,
                 watch_s: float = WATCH_S, monotonic: Callable[[], float] = time.monotonic,
                 wake: Wake | None = None, remote_s: float = REMOTE_S) -> None:
        self.store, self.clock, self.market = store, clock, market
        self.heartbeat_s, self.watch_s = heartbeat_s, watch_s
        self.monotonic = monotonic
        self.wake, self.remote_s = wake, remote_s  # without a wake, every tick reads the store
        self._seen: Signature | None = None  # what the store said right after the last step
        self._again = True  # the last step changed something (or there was none yet)
        self._due_at = 0.0
        self._in_flight = True  # as the last read said
        self._read_by = 0.0  # when the store is read again even if nothing is written here

    def read(self) -> tuple[bool, bool, Signature]:
        """(anything in flight, any job running or cluster up, what has happened so far), in one statement."""
        latest = [select(func.max(column)).scalar_subquery() for column in (
            JobEventRow.id, NoticeRow.id, NoticeRow.handled_at, CheckpointReportRow.id, ProgressRow.id,
            GpuMinuteRow.id, PriceQuoteRow.id, PolicyOverrideRow.applied_at)]
        facts = [exists().where(JobRow.state.in_(IN_FLIGHT)) | exists().where(ClusterRow.state.in_(FLUX)),
                 exists().where(JobRow.state == JobState.RUNNING.value)
                 | exists().where(ClusterRow.state == ClusterState.UP.value)]
        with self.store.transaction() as s:
            row = s.execute(select(*facts, *latest)).one()
        return bool(row[0]), bool(row[1]), tuple(row[2:])

    def should_step(self) -> bool:
        now = self.monotonic()
        if (self.wake is not None and not self.wake.take() and not self._in_flight and not self._again
                and now < self._due_at and now < self._read_by):
            return False  # nothing written here since the last read, nothing under way or due: no read
        in_flight, _, happened = self.read()
        self._in_flight, self._read_by = in_flight, now + self.remote_s
        return in_flight or self._again or happened != self._seen or now >= self._due_at

    def stepped(self, before: Signature | None = None) -> None:
        """After a step: remember what the store says now, and when the next thing falls due."""
        in_flight, watching, now = self.read()
        self._again = before is not None and now != before
        self._seen, self._in_flight, self._read_by = now, in_flight, self.monotonic() + self.remote_s
        self._due_at = self.monotonic() + self._next_due_s(self.watch_s if watching else self.heartbeat_s)

    def _next_due_s(self, at_most: float) -> float:
        """Wall seconds to the market's next tick, or ``at_most`` if sooner (or the market has no ticks)."""
        tick = self.market.tick_seconds
        speed = getattr(self.clock, "speed", 1.0) or 1.0
        if not tick or tick <= 0 or not math.isfinite(tick):
            return at_most
        market_now = self.clock.now().timestamp()
        to_next = (math.floor(market_now / tick) + 1) * tick - market_now
        return min(at_most, max(to_next / speed, 0.0))
