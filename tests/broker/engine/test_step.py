"""A broker killed mid-migration loses nothing: a new engine on the same store finishes the job."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.engine import Engine
from broker.model import JobState
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import ClusterRow, JobRow, LedgerRow
from providers.base import SpotQuote
from providers.trace import write_trace
from tests.ledger_checks import assert_one_cluster_per_zone_and_whole_ledger

JOB = """\
name: small
num_nodes: 1
resources:
  accelerators: V100:1
workdir: {workdir}
run: python train.py --steps 400 --step-seconds 0.05 --checkpoint-every 20
"""


def _trace(path: Path) -> Path:
    """Two zones; the cheap one loses capacity at minute 10 (10 s of wall time at speed 60: the job, 20 s
    of steps, started in it well before on a loaded machine, and still runs)."""
    from datetime import UTC, datetime

    start = datetime(2026, 1, 1, tzinfo=UTC)
    quotes = []
    for tick in range(120):
        when = start + timedelta(minutes=tick)
        quotes.append(SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.9, 3.06, when,
                                available_nodes=0 if 10 <= tick < 60 else 2))
        quotes.append(SpotQuote("gcp", "us-central1", "us-central1-a", "n1-highmem-8", "V100", 1, 1.0, 2.95, when,
                                available_nodes=2))
    write_trace(path, quotes)
    return path


def _step_until(engine: Engine, job_id: str, states: set[str], timeout: float = 180) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        engine.step()
        with engine.store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None
            if job.state in states:
                return job.state
        time.sleep(0.05)
    raise AssertionError(f"job never reached {states}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_engine_killed_mid_migration_is_finished_by_the_next(tmp_path: Path, broker_home: Path, db_url: str) -> None:
    settings = load_settings(market=_trace(tmp_path / "market.csv"), speed=60.0, db_url=db_url,
                             local_provision_seconds=60.0)
    examples = Path(__file__).resolve().parents[3] / "examples"
    spec = parse_job_spec(JOB.format(workdir=examples), source=str(tmp_path / "job.yaml"))

    first = assemble(settings, fresh_market=True)
    engine = first.start()
    job_id = engine.submit(spec)
    state = _step_until(engine, job_id, {JobState.CHECKPOINTING.value, JobState.MIGRATING.value})
    assert state in (JobState.CHECKPOINTING.value, JobState.MIGRATING.value)
    first.close()  # the broker dies here: its notice API and in-memory state are gone

    second = assemble(settings, open_store(db_url))
    engine = second.start()
    assert _step_until(engine, job_id, {JobState.SUCCEEDED.value, JobState.FAILED.value}) == "SUCCEEDED"
    for _ in range(5):
        engine.step()
        time.sleep(0.1)
    with engine.store.transaction() as s:
        job = s.get(JobRow, job_id)
        clusters = list(s.scalars(select(ClusterRow).where(ClusterRow.job_id == job_id)))
        ledger = list(s.scalars(select(LedgerRow).order_by(LedgerRow.cluster_id, LedgerRow.minute)))
    second.close()
    assert job is not None and job.migrations == 1 and len(job.zones) == 2
    assert_one_cluster_per_zone_and_whole_ledger(job, clusters, ledger)


FREEZE = """
import gc
from broker.engine.step import freeze_long_lived
kept = [{"row": i} for i in range(1000)]  # what a view keeps from its first step
freeze_long_lived()
frozen = gc.get_freeze_count()
assert frozen >= 1000, frozen
freeze_long_lived()  # once per process: later objects stay in the collector's reach
assert gc.get_freeze_count() == frozen
print(frozen)
"""


def test_what_lives_from_the_first_step_on_is_frozen_once_per_process() -> None:
    """In a process of its own: freezing in the test worker would keep its later garbage cycles."""
    done = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 1000
