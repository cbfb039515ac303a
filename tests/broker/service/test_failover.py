"""`broker serve` replicas on one PostgreSQL, their leader killed, frozen or stopped mid-run.

The replicas share one broker home (the local backend's clusters and market replay live there,
as they would on one machine); everything else they share is the database. The database logs
every write to the engine's tables with the leader epoch of its transaction (``write_audit``), so
"the old leader wrote nothing more" is checked where it counts.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from broker.store import open_store
from broker.store.tables import ClusterRow, JobRow, LedgerRow, NoticeRow
from broker.tokens import create_api_token
from tests.broker.service.replicas import (
    ROOT,
    Fleet,
    Replica,
    audited_writes,
    chaos,
    flapping_trace,
    lease_changes,
    start_replica,
    two_zone_trace,
    wait_for,
)
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
@pytest.mark.timeout(600)  # replicas take a minute to start on a loaded machine
def test_leader_killed_mid_migration_the_other_replica_finishes(tmp_path: Path, broker_home: Path,
                                                               postgres_url: str) -> None:
    # The cheap zone goes late enough for slow replica starts; the job is submitted 12 market
    # minutes before it goes, so it starts there and is preempted there, however long they took.
    lost_from = 200
    market = two_zone_trace(tmp_path / "market.csv", cheap_lost_from=lost_from, cheap_lost_until=lost_from + 75,
                            ticks=lost_from + 160)
    env = {"BROKER_HOME": str(broker_home), "BROKER_DB_URL": postgres_url,
           "BROKER_MARKET": str(market), "BROKER_SPEED": "60",
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

        world = json.loads((broker_home / "local" / "world.json").read_text())

        def market_minute() -> float:
            return (time.time() - world["wall_origin"]) * world["speed"] / 60

        assert market_minute() < lost_from - 14, "the replicas took longer to start than this market allows"
        time.sleep(max((lost_from - 12 - market_minute()) * 60 / world["speed"], 0.0))

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


def epoch_of(replica: Replica) -> int:
    return max(int(line["epoch"]) for line in replica.lines() if line.get("event") == "leader_acquired")


@pytest.mark.slow
@pytest.mark.timeout(600)  # replicas take a minute to start on a loaded machine
def test_a_frozen_leader_is_replaced_and_writes_nothing_when_it_wakes(tmp_path: Path, broker_home: Path,
                                                                      postgres_url: str) -> None:
    """SIGSTOP the leader (a GC pause, a stalled VM): it keeps nothing but its lease, and that runs out."""
    fleet = Fleet(tmp_path, broker_home, postgres_url, flapping_trace(tmp_path / "market.csv"))
    try:
        fleet.start(2)
        old = fleet.leader()
        for _ in range(4):
            fleet.submit(steps=300)
        wait_for(lambda: "RUNNING" in fleet.states().values() or None, 120, "a job to run")
        old.process.send_signal(signal.SIGSTOP)
        frozen = time.time()
        new = fleet.leader(timeout=60)
        took_over = time.time() - frozen
        old_epoch, new_epoch = epoch_of(old), epoch_of(new)
        time.sleep(2)
        old.process.send_signal(signal.SIGCONT)  # it wakes in the middle of whatever it was doing
        wait_for(lambda: any(line.get("event") == "leader_lost" for line in old.lines()), 30,
                 "the old one to step down")
        states = fleet.wait_finished(300)
        checks = fleet.check()
        writes = audited_writes(postgres_url)
        print(f"{old.name} frozen; {new.name} led {took_over:.1f} s later (epoch {old_epoch} -> {new_epoch})")

        assert took_over < 30
        assert new_epoch > old_epoch and new is not old
        assert set(states.values()) == {"SUCCEEDED"}
        _, ended = lease_changes(writes)[old_epoch]
        by_old = [w for w in writes if w.epoch == old_epoch and w.tbl != "leader_lease"]
        assert by_old and ended is not None  # it did write, while it led
        assert [w for w in by_old if w.ts >= ended] == []  # and nothing once its lease was taken
        assert checks["late_writes"] == []
        assert any(w.epoch == new_epoch and w.tbl == "job_events" for w in writes)
        assert (old.health() or {}).get("leader") is False
        assert checks["ledger_violations"] == []
        assert checks["jobs_started_twice"] == 0 and checks["clusters_without_row"] == 0
        assert checks["clusters_left_up"] == 0
    finally:
        fleet.close()


@pytest.mark.slow
@pytest.mark.timeout(600)  # replicas take a minute to start on a loaded machine
def test_a_leader_told_to_stop_releases_the_lease_and_does_nothing_after(tmp_path: Path, broker_home: Path,
                                                                         postgres_url: str) -> None:
    """SIGTERM mid-run: no transition and no cloud call once the lease is released; the other leads at once."""
    fleet = Fleet(tmp_path, broker_home, postgres_url, flapping_trace(tmp_path / "market.csv"))
    try:
        fleet.start(2, "--log-level", "debug")
        old = fleet.leader()
        for _ in range(6):
            fleet.submit(steps=200)
        wait_for(lambda: "RUNNING" in fleet.states().values() or None, 120, "a job to run")
        old.process.send_signal(signal.SIGTERM)
        stopped = time.time()
        assert old.process.wait(timeout=30) == 0
        new = fleet.leader(timeout=30)
        took_over = time.time() - stopped
        states = fleet.wait_finished(300)
        checks = fleet.check()
        writes = audited_writes(postgres_url)
        old_epoch = epoch_of(old)
        print(f"{old.name} stopped; {new.name} led {took_over:.1f} s later")

        events = [line.get("event") for line in old.lines()]
        released = events.index("leader_released")
        assert "cloud_call" in events[:released]  # it was working
        assert "cloud_call" not in events[released:]
        assert old.lines()[released]["epoch"] == old_epoch
        _, ended = lease_changes(writes)[old_epoch]
        assert ended is not None and [w for w in writes if w.epoch == old_epoch and w.ts >= ended
                                      and w.tbl != "leader_lease"] == []
        holders = [w.holder for w in writes if w.tbl == "leader_lease" and w.ts >= ended]
        assert holders[0] is None  # released, not taken over after it expired
        taken, _ = lease_changes(writes)[epoch_of(new)]
        assert (taken - ended).total_seconds() < 10  # the next leader check after the release
        assert took_over < 60  # from the signal, through the old one's shutdown, to /v1/health saying so
        assert set(states.values()) == {"SUCCEEDED"}
        assert checks["late_writes"] == [] and checks["ledger_violations"] == []
        assert checks["jobs_started_twice"] == 0 and checks["clusters_left_up"] == 0
    finally:
        fleet.close()


@pytest.mark.slow
@pytest.mark.timeout(3000)  # replicas take a minute to start on a loaded machine, and each kill restarts one
def test_chaos_the_leader_killed_at_twenty_random_moments(tmp_path: Path, broker_home: Path,
                                                          postgres_url: str) -> None:
    """SIGKILL the leader 20 times while a queue with preemptions runs: every job finishes, nothing twice."""
    market = flapping_trace(tmp_path / "market.csv")
    # A lease of 2.5 s (five checks of 0.5 s): each of the twenty takeovers waits out one lease.
    fleet = Fleet(tmp_path, broker_home, postgres_url, market, BROKER_LEADER_CHECK_SECONDS="0.5")
    try:
        fleet.start(4)
        # Jobs of 50 s outlast the market's 45 s cycle: one on the cheap zone is preempted during the kills.
        run = chaos(fleet, kills=20, rng=random.Random(22), steps=1000, timeout=1200)
        print(f"kills {run.kills}, takeovers {len(run.takeovers)} in {min(run.takeovers):.1f}-"
              f"{max(run.takeovers):.1f} s, jobs {run.jobs} {run.finished}, checks {run.checks}")
        assert run.kills == 20 and len(run.takeovers) == 20
        assert run.finished == {"SUCCEEDED": run.jobs}
        assert run.checks["ledger_violations"] == []
        assert run.checks["late_writes"] == []
        assert run.checks["jobs_started_twice"] == 0 and run.checks["clusters_without_row"] == 0
        assert run.checks["clusters_left_up"] == 0
        with fleet.store.transaction() as s:
            preempted = s.scalar(select(JobRow.id).where(JobRow.migrations > 0).limit(1))
        assert preempted is not None  # the run had preemptions to recover from
    finally:
        fleet.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_leader_killed_between_claiming_a_node_and_launching_it_the_other_replica_restarts_the_job(
        tmp_path: Path, broker_home: Path, postgres_url: str) -> None:
    import os

    market = two_zone_trace(tmp_path / "market.csv", cheap_lost_from=10_000, cheap_lost_until=10_001, ticks=600)
    out = tmp_path / "ran"
    fleet = Fleet(tmp_path, broker_home, postgres_url, market, BROKER_LOCAL_PROVISION_SECONDS="300",
                  BROKER_LEADER_CHECK_SECONDS="1", BROKER_START_RETRIES="0")
    try:
        fleet.start(2)
        leader = fleet.leader()
        spec = (f"name: claimed\nresources:\n  accelerators: V100:1\nworkdir: {tmp_path}\n"
                f"run: echo attempt $BROKER_ATTEMPT >> {out}\n")
        response = httpx.post(f"{leader.url}/v1/jobs", json={"spec": spec}, timeout=60,
                              headers={"Authorization": f"Bearer {fleet.token}"})
        assert response.status_code == 201, response.text
        job_id = response.json()["job_id"]
        # Its nodes take 5 wall seconds to boot: time to make the first start's node log a FIFO nobody
        # reads, so the leader claims the node, writes its scripts, then blocks before the launch.
        logs = broker_home / "logs" / job_id
        logs.mkdir(parents=True, exist_ok=True)
        os.mkfifo(logs / "attempt-1-node-0.log")
        node = wait_for(lambda: next(broker_home.glob(f"local/clusters/*/runs/{job_id}-1/node-0/job.sh"), None),
                        120, "the leader to claim the node").parent
        time.sleep(0.5)
        assert leader.process.poll() is None and not (node / "started").exists()
        leader.process.send_signal(signal.SIGKILL)
        leader.process.wait()
        (logs / "attempt-1-node-0.log").unlink()
        fleet.leader()  # the other replica takes over
        states = fleet.wait_finished(180)
        assert states[job_id] == "SUCCEEDED"
        assert out.read_text() == "attempt 2\n"  # started once, by the replica that took over
        checks = fleet.check()
        assert checks["jobs_started_twice"] == 0 and checks["clusters_left_up"] == 0
        assert not checks["ledger_violations"] and not checks["late_writes"]
        with fleet.store.transaction() as s:
            job = s.get(JobRow, job_id)
            clusters = list(s.scalars(select(ClusterRow).where(ClusterRow.job_id == job_id)))
            ledger = list(s.scalars(select(LedgerRow).order_by(LedgerRow.cluster_id, LedgerRow.minute)))
        assert job is not None and job.attempt == 2 and len(clusters) == 1
        assert_one_cluster_per_zone_and_whole_ledger(job, clusters, ledger)
    finally:
        fleet.close()
