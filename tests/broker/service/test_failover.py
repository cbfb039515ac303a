"""Two `broker serve` replicas on one PostgreSQL: the leader is SIGKILLed mid-migration, the other finishes.

Both replicas share one broker home (the local backend's clusters and market replay live there,
as they would on one machine); everything else they share is the database.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from broker.store import open_store
from broker.store.tables import ClusterRow, JobRow, LedgerRow, NoticeRow
from broker.tokens import create_api_token
from tests.broker.service.replicas import ROOT, Replica, start_replica, two_zone_trace, wait_for
from tests.ledger_checks import assert_one_cluster_per_zone_and_whole_ledger

JOB = """\
name: failover
num_nodes: 1
resources:
  accelerators: V100:1
workdir: {workdir}
run: python train.py --steps 400 --step-seconds 0.05 --checkpoint-every 40
"""


@pytest.mark.slow
def test_leader_killed_mid_migration_the_other_replica_finishes(tmp_path: Path, broker_home: Path,
                                                               postgres_url: str) -> None:
    env = {"BROKER_HOME": str(broker_home), "BROKER_DB_URL": postgres_url,
           "BROKER_MARKET": str(two_zone_trace(tmp_path / "market.csv")), "BROKER_SPEED": "60",
           "BROKER_LOCAL_PROVISION_SECONDS": "60", "BROKER_POLL_SECONDS": "0.2",
           "BROKER_LEADER_CHECK_SECONDS": "1"}
    store = open_store(postgres_url)
    token = create_api_token(store, "research").token
    replicas: list[Replica] = []
    try:
        replicas.append(start_replica("a", env, tmp_path))
        replicas.append(start_replica("b", env, tmp_path))
        leader = wait_for(lambda: next((r for r in replicas if (r.health() or {}).get("leader")), None), 30,
                          "a leader")
        follower = next(r for r in replicas if r is not leader)
        assert follower.health() == {"status": "ok", "leader": False}

        # Submitted through the follower: any replica takes jobs, the leader's engine runs them.
        auth = {"Authorization": f"Bearer {token}"}
        spec = JOB.format(workdir=ROOT / "examples")
        response = httpx.post(f"{follower.url}/v1/jobs", json={"spec": spec}, headers=auth, timeout=30)
        assert response.status_code == 201, response.text
        job_id = response.json()["job_id"]

        def state() -> str:
            return str(httpx.get(f"{follower.url}/v1/jobs/{job_id}", headers=auth, timeout=10).json()["state"])

        wait_for(lambda: state() in ("CHECKPOINTING", "MIGRATING") or None, 90, "the job to start migrating")
        leader.process.send_signal(signal.SIGKILL)
        leader.process.wait()
        killed_at = time.time()
        killed_in = state()

        wait_for(lambda: (follower.health() or {}).get("leader"), 30, "the follower to take over")
        took_over = time.time() - killed_at
        print(f"leader {leader.name} killed while the job was {killed_in}; {follower.name} led {took_over:.1f} s later")
        final = wait_for(lambda: state() in ("SUCCEEDED", "FAILED") and state(), 120, "the job to finish")
        assert final == "SUCCEEDED"
        time.sleep(3)  # teardown and the last ledger minutes

        with store.transaction() as s:
            job = s.get(JobRow, job_id)
            clusters = list(s.scalars(select(ClusterRow).where(ClusterRow.job_id == job_id)))
            ledger = list(s.scalars(select(LedgerRow).order_by(LedgerRow.cluster_id, LedgerRow.minute)))
            notices = list(s.scalars(select(NoticeRow)))
        assert killed_in in ("CHECKPOINTING", "MIGRATING", "RUNNING")
        assert took_over < 30
        assert job is not None and job.migrations == 1 and job.zones == ["us-east-1a", "us-central1-a"]
        assert_one_cluster_per_zone_and_whole_ledger(job, clusters, ledger)
        assert len(notices) == 1  # the preemption notice, once, whichever path reported it
        for replica in replicas:  # no secret in any log line
            assert token not in replica.log.read_text()
        events = [line.get("event") for line in follower.lines()]
        assert "leader_acquired" in events
        assert "leader_acquired" in [line.get("event") for line in leader.lines()]
    finally:
        for replica in replicas:
            replica.stop()
        store.dispose()
