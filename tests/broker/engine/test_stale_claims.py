"""A broker killed between claiming a job's node and launching its process loses neither the job
nor a ledger minute: the broker that takes over (a restart, or the other replica on the same store)
sees the node has no process, and starts the job again on the same GPUs. Real processes throughout:
the killed broker is a ``broker run-engine`` process, the nodes real cluster hosts and agents."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.model import JobState
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobEventRow, LedgerRow
from tests.broker.engine.one_zone import job_row, one_zone_market, run_until
from tests.broker.service.replicas import wait_for
from tests.ledger_checks import assert_one_cluster_per_zone_and_whole_ledger, ledger_outside_cluster_life

SETTINGS: dict[str, Any] = {"speed": 60.0, "local_provision_seconds": 30.0, "start_retries": 0}


@pytest.mark.slow
def test_a_broker_killed_between_claim_and_launch_the_next_one_runs_the_job(tmp_path: Path, broker_home: Path,
                                                                            db_url: str) -> None:
    market = one_zone_market(tmp_path / "market.csv", available=2)
    settings = load_settings(market=market, db_url=db_url, **SETTINGS)
    out = tmp_path / "ran"
    spec = parse_job_spec(f"name: claimed\nresources:\n  accelerators: V100:4\nworkdir: {tmp_path}\n"
                          f"run: echo attempt $BROKER_ATTEMPT >> {out}\n", source=str(tmp_path / "job.yaml"))
    first = assemble(settings, fresh_market=True)
    job_id = first.engine(None).submit(spec)
    first.close()
    # The node log of the first start is a FIFO nobody reads: the broker that starts the job claims the
    # node, writes its scripts, then blocks opening the log, between the claim and the launch.
    logs = broker_home / "logs" / job_id
    logs.mkdir(parents=True)
    fifo = logs / "attempt-1-node-0.log"
    os.mkfifo(fifo)
    env = {**os.environ, "BROKER_HOME": str(broker_home), "BROKER_MARKET": str(market), "BROKER_DB_URL": db_url,
           **{f"BROKER_{k.upper()}": str(v) for k, v in SETTINGS.items()}}
    with open(tmp_path / "killed-broker.log", "wb") as log:
        killed = subprocess.Popen([sys.executable, "-m", "broker", "run-engine"], env=env, stdout=log, stderr=log,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    second = None
    try:
        node = wait_for(lambda: next(broker_home.glob(f"local/clusters/*/runs/{job_id}-1/node-0/job.sh"), None),
                     timeout=120, what="the first broker to claim the node").parent
        time.sleep(0.5)
        assert killed.poll() is None and not (node / "started").exists()
        os.killpg(killed.pid, signal.SIGKILL)  # the broker dies between the claim and the launch
        killed.wait(timeout=10)
        fifo.unlink()

        second = assemble(settings, open_store(db_url))
        engine = second.start()
        run_until(engine, lambda: JobState(job_row(engine, job_id).state).terminal, timeout=120)
        job = job_row(engine, job_id)
        assert job.state == JobState.SUCCEEDED.value, job.reason
        assert out.read_text() == "attempt 2\n"  # the second start ran it, once; the first never ran
        run_until(engine, lambda: not engine.active_jobs() and _all_ended(engine, job_id), timeout=60)
        with engine.store.transaction() as s:
            job = job_row(engine, job_id)
            clusters = list(s.scalars(select(ClusterRow).where(ClusterRow.job_id == job_id)))
            ledger = list(s.scalars(select(LedgerRow).order_by(LedgerRow.cluster_id, LedgerRow.minute)))
            allocations = list(s.scalars(select(AllocationRow).where(AllocationRow.job_id == job_id)
                                         .order_by(AllocationRow.attempt)))
            kinds = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id))]
        assert len(clusters) == 1 and [a.outcome for a in allocations] == ["no_process", "succeeded"]
        assert allocations[0].ended_at is not None and allocations[0].ended_at <= allocations[1].started_at
        assert "no_process" in kinds and "start_failed" not in kinds  # not the job's failed start
        assert_one_cluster_per_zone_and_whole_ledger(job, clusters, ledger)
        assert not ledger_outside_cluster_life(clusters, ledger)
        assert len({(r.cluster_id, r.minute, r.holder) for r in ledger}) == len(ledger)  # no minute billed twice
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
        if second is not None:
            second.close()
        for status in broker_home.glob("local/clusters/*/status.json"):
            (status.parent / "terminate").touch()


def _all_ended(engine: Any, job_id: str) -> bool:
    with engine.store.transaction() as s:
        rows = list(s.scalars(select(ClusterRow).where(ClusterRow.job_id == job_id)))
    return bool(rows) and all(r.state in ("TERMINATED", "FAILED") for r in rows)
