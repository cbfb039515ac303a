"""`broker serve` on the SkyPilot backend: the leader's engine launches through SkyPilot on the price book.

In process, with SkyPilot's API server played by the stand-in (``tests/skystandin``), on SQLite and on
PostgreSQL; the processes, failover and real agents are the end-to-end test's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import ConfigError, load_settings
from broker.engine.machine import submit_job
from broker.market.book import PriceBook
from broker.service.runner import Service
from broker.spec.job import parse_job_spec
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow
from providers.base import SpotQuote
from tests.skystandin.server import SkyStandIn

JOB = "name: train\nnum_nodes: 2\nresources:\n  accelerators: V100:1\nrun: python train.py\n"


def wait(done: Callable[[], bool], timeout: float = 90.0, what: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not reached: {what()}")


def lead(service: Service) -> None:
    """What `Service.run` does without its signals and API: renew the lease on one thread and campaign on
    another, so a lease that runs out while the machine is loaded is taken again, as a replica would."""
    def campaign() -> None:
        while not service._stop.is_set():
            service._campaign()
            service._stop.wait(service.settings.leader_check_seconds)

    threading.Thread(target=service._renew, daemon=True).start()
    threading.Thread(target=campaign, daemon=True).start()
    wait(lambda: service.leading and service.engine is not None, timeout=60)


def state(store: Store, job_id: str) -> str | None:
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        return None if job is None else f"{job.state} ({job.reason})"


def test_the_leader_launches_in_the_zone_the_price_book_made_cheapest(broker_home: Path, db_url: str,
                                                                      skypilot: SkyStandIn) -> None:
    store = open_store(db_url)
    now = datetime.now(UTC)
    PriceBook(store).record("aws", [
        SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 1.10, 3.06, now),
        SpotQuote("aws", "us-west-2", "us-west-2b", "p3.2xlarge", "V100", 1, 0.85, 3.06, now, capacity_score=9.0),
        SpotQuote("aws", "us-east-2", "us-east-2a", "p3.2xlarge", "V100", 1, 0.40, 3.06, now, capacity_score=1.0),
    ], at=now)
    # cheapest_spot: the plain rule, so the zone follows from prices and capacity alone (the default
    # policy may choose to wait for the cheaper zone's capacity to come back).
    settings = load_settings(backend="skypilot", serve_port=0, leader_check_seconds=1.0, poll_seconds=0.2,
                             db_url=db_url, selection_policy="cheapest_spot", price_poll_seconds={})
    sky = skypilot
    service = Service(settings, store, sdk=sky.sdk())
    try:
        lead(service)
        job_id = submit_job(store, service.runtime.clock, parse_job_spec(JOB, offline=True), broker_home, "skypilot")

        def running() -> bool:
            with store.transaction() as s:
                job = s.get(JobRow, job_id)
                return job is not None and job.state == "RUNNING"

        wait(running, what=lambda: f"job {state(store, job_id)}, SkyPilot calls {sky.calls[-4:]}")
        with store.transaction() as s:
            (cluster,) = s.scalars(select(ClusterRow))
            # us-east-2a is cheaper still, but its placement score says a launch is unlikely there.
            assert (cluster.zone, cluster.price_per_node_hour, cluster.spot) == ("us-west-2b", 0.85, True)
        (launched,) = sky.clusters.values()
        assert launched.task["resources"]["infra"] == "aws/us-west-2/us-west-2b"
        wait(lambda: bool(launched.jobs), what=lambda: f"SkyPilot calls {sky.calls[-4:]}")  # the exec arrived
        sky.finish_jobs()
        wait(lambda: (state(store, job_id) or "").startswith("SUCCEEDED"),
             what=lambda: f"job {state(store, job_id)}, leading {service.leading}")
    finally:
        service.shutdown()


def test_a_replica_takes_over_a_dead_leader_and_adopts_its_cluster(broker_home: Path, db_url: str,
                                                                    skypilot: SkyStandIn) -> None:
    """The leader stops dead (no renewal, no release: a SIGKILL or a frozen host); the other replica
    takes the lease when it runs out, finds the gang in SkyPilot's status and finishes the job."""
    store = open_store(db_url)
    now = datetime.now(UTC)
    PriceBook(store).record("aws", [
        SpotQuote("aws", "us-west-2", "us-west-2b", "p3.2xlarge", "V100", 1, 0.85, 3.06, now, capacity_score=9.0),
    ], at=now)
    settings = load_settings(backend="skypilot", serve_port=0, leader_check_seconds=1.0, poll_seconds=0.2,
                             db_url=db_url, selection_policy="cheapest_spot", price_poll_seconds={})
    sky = skypilot  # one SkyPilot API server, as both replicas share, each with its own client
    first, second = Service(settings, store, sdk=sky.sdk()), Service(settings, open_store(db_url), sdk=sky.sdk())
    try:
        lead(first)
        job_id = submit_job(store, first.runtime.clock, parse_job_spec(JOB, offline=True), broker_home, "skypilot")
        wait(lambda: (state(store, job_id) or "").startswith("RUNNING"), what=lambda: f"job {state(store, job_id)}")
        first._stop.set()  # no more renewals
        first._stop_scheduler()  # and no more steps: dead, holding the lease until it runs out
        if first.lock.gate is not None:  # SQLite: the file lock goes with the process (same process here)
            first.lock.gate.release()
        threading.Thread(target=second._renew, daemon=True).start()

        def took_over() -> bool:
            second._campaign()
            return second.leading

        wait(took_over, timeout=60)
        wait(lambda: any(c.jobs for c in sky.clusters.values()), what=lambda: f"SkyPilot calls {sky.calls[-4:]}")
        sky.finish_jobs()
        wait(lambda: (state(store, job_id) or "").startswith("SUCCEEDED"),
             what=lambda: f"job {state(store, job_id)}, leading {second.leading}")
        assert sky.count("launch") == 1  # adopted, not launched again
    finally:
        second.shutdown()
        first.shutdown()


def test_an_unknown_backend_is_refused_naming_the_setting(broker_home: Path) -> None:
    with pytest.raises(ConfigError, match="backend: expected local or skypilot, got 'nimbus'"):
        Service(load_settings(backend="nimbus", serve_port=0))


def test_a_notice_moves_on_the_checkpoint_reported_after_it(broker_home: Path, db_url: str,
                                                             skypilot: SkyStandIn) -> None:
    """The notice's own report names no checkpoint (a node path the notice API does not take, or a report
    lost); the checkpoint the agent reported after seeing the notice is enough to move, well before the
    notice runs out, and the job resumes from it."""
    from datetime import timedelta

    from broker.api.notices import NoticeReport, notice_of
    from broker.engine.checkpoint_reports import ReportedCheckpoint, record
    from broker.notices.record import record_notice

    store = open_store(db_url)
    now = datetime.now(UTC)
    PriceBook(store).record("aws", [
        SpotQuote("aws", "us-west-2", "us-west-2b", "p3.2xlarge", "V100", 1, 0.85, 3.06, now, capacity_score=9.0),
        SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.90, 3.06, now, capacity_score=9.0),
    ], at=now)
    settings = load_settings(backend="skypilot", serve_port=0, leader_check_seconds=1.0, poll_seconds=0.2,
                             db_url=db_url, selection_policy="cheapest_spot", price_poll_seconds={})
    service = Service(settings, store, sdk=skypilot.sdk())
    spec = JOB.replace("run:", "broker:\n  checkpoint:\n    dir: s3://bucket/train\nrun:")
    try:
        lead(service)
        job_id = submit_job(store, service.runtime.clock, parse_job_spec(spec, offline=True), broker_home, "skypilot")
        wait(lambda: (state(store, job_id) or "").startswith("RUNNING"), what=lambda: f"job {state(store, job_id)}")
        with store.transaction() as s:
            (cluster_id,) = s.scalars(select(ClusterRow.id))
        seen = datetime.now(UTC)
        notice = NoticeReport(cluster_id=cluster_id, node="0", kind="terminate", noticed_at=seen,
                              action_time=seen + timedelta(minutes=2))
        record_notice(store, service.runtime.clock, notice_of(notice, service.runtime.clock), source="agent")
        record(store, ReportedCheckpoint(job_id, cluster_id, "0", "step-000010.npz", seen + timedelta(seconds=1), 10),
               datetime.now(UTC))

        def resumed() -> bool:
            with store.transaction() as s:
                job = s.get(JobRow, job_id)
                return job is not None and job.state == "RUNNING" and job.attempt == 2

        wait(resumed, timeout=60, what=lambda: f"job {state(store, job_id)}")
        assert datetime.now(UTC) < seen + timedelta(minutes=2)
        with store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None and job.checkpoint == "s3://bucket/train/step-000010.npz"
            assert job.zones == ["us-west-2b", "us-east-1a"]
    finally:
        service.shutdown()
