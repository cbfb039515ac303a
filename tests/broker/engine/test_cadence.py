"""Periodic checkpoints on a real local run: measured first, then at the interval the rule gives."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.engine.cadence import ASKED
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store.tables import CheckpointReportRow, JobEventRow, JobRow
from policies.checkpointing import FIXED_INTERVAL_S, daly_interval
from providers.base import SpotQuote
from providers.trace import write_trace

# A job whose checkpoint takes half a wall second (120 market seconds at 240x): more than GCP's
# 30 s notice, so only periodic checkpoints can keep its work.
SLOW_CHECKPOINT_JOB = """
import os, signal, sys, time
from pathlib import Path
d = Path(os.environ["BROKER_CHECKPOINT_DIR"])
asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
step = 0
end = time.time() + {seconds}
while time.time() < end:
    time.sleep(0.05)
    step += 1
    if asked:
        asked.clear()
        time.sleep(0.5)
        (d / f"ckpt-{{step}}").write_text("weights")
        (d / ".tmp").write_text(f"ckpt-{{step}}\\nstep={{step}}\\n")
        os.replace(d / ".tmp", d / "LATEST")
"""


def _market(path: Path, uptime: float | None = None) -> Path:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    write_trace(path, [SpotQuote("gcp", "us-central1", "us-central1-a", "n1-highmem-8", "V100", 1, 0.9, 2.9,
                                 start + timedelta(minutes=t), available_nodes=1, estimated_uptime_s=uptime)
                       for t in range(600)], signals=uptime is not None)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("uptime", [None, 7200.0])
def test_a_job_is_asked_to_checkpoint_then_at_the_young_daly_interval(tmp_path: Path, uptime: float | None) -> None:
    """Without a word from the cloud the hazard's prior is one preemption a day; with GCP's
    estimated uptime on the market's quotes (2 hours here), one per that uptime."""
    (tmp_path / "job.py").write_text(SLOW_CHECKPOINT_JOB.format(seconds=35))
    spec = parse_job_spec(f"name: slow-ckpt\nresources:\n  accelerators: V100:1\nworkdir: {tmp_path}\n"
                          "run: python job.py\n", source=str(tmp_path / "job.yaml"))
    settings = load_settings(market=_market(tmp_path / "m.csv", uptime), speed=240.0, local_provision_seconds=60.0)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    try:
        job_id = engine.submit(spec)
        deadline = time.time() + 120
        while time.time() < deadline:
            engine.step()
            with engine.store.transaction() as s:
                job = s.get(JobRow, job_id)
                assert job is not None
                if job.state in ("SUCCEEDED", "FAILED"):
                    break
            time.sleep(0.05)
        with engine.store.transaction() as s:
            job = s.get(JobRow, job_id)
            asks = list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.kind == ASKED)
                                  .order_by(JobEventRow.at)))
            reports = list(s.scalars(select(CheckpointReportRow).where(CheckpointReportRow.job_id == job_id)
                                     .order_by(CheckpointReportRow.written_at)))
            running_at = min(e.at for e in s.scalars(select(JobEventRow).where(
                JobEventRow.job_id == job_id, JobEventRow.to_state == "RUNNING")))
    finally:
        broker.close()
    assert job is not None and job.state == "SUCCEEDED"
    assert len(asks) >= 2, [a.detail for a in asks]
    first, second = asks[0], asks[1]
    # First: after 15 minutes of work, to measure the checkpoint.
    assert first.detail["interval_s"] == FIXED_INTERVAL_S and "measure" in first.detail["reason"]
    assert (first.at - running_at).total_seconds() >= FIXED_INTERVAL_S
    # Each ask was answered by a reported checkpoint.
    assert all(any(r.written_at >= a.at for r in reports) for a in asks)
    # Then: the checkpoint measured (about 120 market seconds) does not fit GCP's 30 s notice, so the
    # rule asks again after Daly's interval for the prior's hazard (no history of its own here).
    measured = second.detail["checkpoint_s"]
    assert 60 <= measured <= 400
    assert "does not fit a 30 s notice" in second.detail["reason"]
    lam = 1 / ((uptime or 24 * 3600.0) + (second.at - running_at).total_seconds())
    expected = daly_interval(measured, 1 / lam)
    assert second.detail["interval_s"] == pytest.approx(expected, rel=0.05)
    last_checkpoint = max(r.written_at for r in reports if r.written_at < second.at)
    assert (second.at - last_checkpoint).total_seconds() >= second.detail["interval_s"]
