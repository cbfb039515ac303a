"""What the engine tests share: a one-zone market of 4-GPU V100 nodes for the local backend, and
stepping the engine until something holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker.engine import Engine
from broker.store.tables import JobRow
from providers.base import SpotQuote
from providers.trace import write_trace

START = datetime(2026, 1, 1, tzinfo=UTC)


def one_zone_market(path: Path, available: int, minutes: int = 600, start: datetime = START) -> Path:
    """AWS us-east-1a selling p3.8xlarge (V100 x4) at a steady price, ``available`` nodes at a time."""
    write_trace(path, [SpotQuote("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, 3.67, 12.24,
                                 start + timedelta(minutes=m), available_nodes=available) for m in range(minutes)])
    return path


def run_until(engine: Engine, done: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        engine.step()
        if done():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def job_row(engine: Engine, job_id: str) -> JobRow:
    """The job's row as it is now, detached from the session."""
    with engine.store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        s.expunge(job)
        return job
