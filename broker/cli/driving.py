"""Driving the embedded engine in the foreground until the jobs a command follows end.

Shared by ``broker launch`` (``cli/jobs.py``) and ``broker engine`` (``cli/engine.py``), so neither
imports the other.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

from broker.cli.app import UsageError
from broker.cli.job_output import progress_table

if TYPE_CHECKING:
    from datetime import datetime

    from broker.config.settings import Settings
    from broker.engine import Engine
    from broker.runtime import Runtime
    from broker.store import Store


def job_summary_of(store: Store, job_id: str, clock_now: datetime | None = None) -> dict[str, Any]:
    """``clock_now``: the broker's clock (the replayed market's on the local backend), which progress
    estimates run on, as ``status`` and the API estimate them."""
    from broker.status.orm_source import job_summary
    from broker.store.tables import JobRow

    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        if job is None:
            raise UsageError(f"no job {job_id!r}")
        return job_summary(s, job, clock_now=clock_now)


def drive(runtime: Runtime, settings: Settings, job_id: str | list[str] | None, show: bool) -> None:
    """Run the engine (or, if another process holds the engine lock, watch) until the job ends
    (every one of them, for the stages of a pipeline; the progress shown is the first still going)."""
    from rich.live import Live

    from broker.cli.app import console
    from broker.engine.step import freeze_long_lived
    from broker.model import JobState
    from broker.runtime import EngineLock
    from broker.status.summary import last_log_line

    watched = [job_id] if isinstance(job_id, str) else list(job_id or [])
    lock = EngineLock(settings.home)
    engine = runtime.start() if lock.acquire() else None
    if engine is None and not watched:
        return
    try:
        with Live(console=console, refresh_per_second=4, transient=False, auto_refresh=False) as live:
            while True:
                if engine is not None:
                    engine.step()
                    freeze_long_lived()
                if watched:
                    summaries = [job_summary_of(runtime.store, one, runtime.clock.now()) for one in watched]
                    going = [x for x in summaries if not JobState(x["state"]).terminal]
                    if show:
                        shown = (going or summaries)[0]
                        live.update(progress_table(shown, last_log_line(settings.home, shown["job_id"])),
                                    refresh=True)
                    if not going:
                        break
                elif engine is not None and not engine.active_jobs():
                    break
                time.sleep(settings.poll_seconds)
            if engine is not None:
                _settle(engine, watched, settings.poll_seconds)
    finally:
        lock.release()


SETTLE_S = 120.0  # at most this long after the jobs ended (a cloud that never confirms a teardown)


def _settle(engine: Engine, watched: list[str], poll_seconds: float) -> None:
    """Step on until the ended jobs' ledger is final: clusters torn down and metered to their end, the GPU
    minutes their agents sent on exit split. A fixed few steps were not enough on a loaded machine."""
    from broker.engine.gpu_attribution import settled

    deadline = time.monotonic() + SETTLE_S
    for step in itertools.count():
        engine.step()
        if (step >= 2 and (not watched or settled(engine.store, watched))) or time.monotonic() > deadline:
            return
        time.sleep(poll_seconds)
