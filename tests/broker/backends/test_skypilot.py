"""The SkyPilot provisioner under the real engine and store, with SkyPilot's API server played by the
stand-in (``tests/skystandin``), reached through its SDK."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.backends.skypilot.provisioner import SkyPilotOptions, SkyPilotProvisioner
from broker.backends.skypilot.runtime import store_specs
from broker.clock import WallClock
from broker.engine import Engine, EngineOptions
from broker.market.book import LiveQuotes
from broker.spec.job import parse_job_spec
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobEventRow, JobRow
from broker.tokens import SharedAgentTokens
from providers.base import OfferKey, SpotQuote
from tests.broker.engine.one_zone import run_until
from tests.skystandin.server import SkyStandIn

JOB = """\
name: train
num_nodes: 2
resources:
  accelerators: V100:1
  disk_size: 200
run: python train.py
broker:
  checkpoint:
    dir: s3://ckpt-bucket/train
"""
EPOCH = datetime.fromtimestamp(0).astimezone()
QUOTES = [  # us-east-1a cheapest, then us-west-2b, then GCP
    SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.92, 3.06, EPOCH),
    SpotQuote("aws", "us-west-2", "us-west-2b", "p3.2xlarge", "V100", 1, 1.01, 3.06, EPOCH),
    SpotQuote("gcp", "us-central1", "us-central1-a", "n1-highmem-8", "V100", 1, 1.20, 2.95, EPOCH),
]


class StaticMarket(LiveQuotes):
    def quotes(self, when: datetime) -> list[SpotQuote]:
        return list(QUOTES)

    def quote(self, key: OfferKey, when: datetime) -> SpotQuote:
        return next(q for q in QUOTES if q.key == key)


def _engine(home: Path, store: Store, sky: SkyStandIn, launch_timeout_s: float = 60.0
            ) -> tuple[Engine, SkyPilotProvisioner]:
    options = SkyPilotOptions(refresh_s=0.05, launch_timeout_s=launch_timeout_s)
    provisioner = SkyPilotProvisioner(home, store_specs(store), options, sdk=sky.sdk())
    engine = Engine(store, WallClock(), StaticMarket(), provisioner,
                    EngineOptions(home=home, broker_url="http://broker.example:8080"),
                    tokens=SharedAgentTokens(store, home))
    return engine, provisioner


def _wait(done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def _job_state(store: Store, job_id: str) -> str:
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        return job.state


def _clusters(store: Store) -> list[ClusterRow]:
    with store.transaction() as s:
        rows = list(s.scalars(select(ClusterRow).order_by(ClusterRow.created_at, ClusterRow.id)))
        s.expunge_all()
        return rows


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path / 'broker.db'}")


def test_launch_returns_at_once_and_the_gang_runs_under_the_agent(broker_home: Path, store: Store,
                                                                   skypilot: SkyStandIn) -> None:
    sky = skypilot
    sky.hold()  # the launch cannot finish until released: a step that waited on it would hang
    engine, _ = _engine(broker_home, store, sky)
    job_id = engine.submit(parse_job_spec(JOB, offline=True))
    engine.step()  # the launch is a request id, not a wait
    _wait(lambda: sky.count("launch") == 1)  # asked for, and still held
    assert _job_state(store, job_id) == "PROVISIONING" and not sky.clusters
    sky.release()
    run_until(engine, lambda: _job_state(store, job_id) == "RUNNING")

    launched = next(c for c in sky.clusters.values())
    assert launched.name == f"broker-{job_id}-c1"
    resources = launched.task["resources"]
    assert (resources["infra"], resources["instance_type"], resources["use_spot"]) == \
        ("aws/us-east-1/us-east-1a", "p3.2xlarge", True)
    assert resources["disk_size"] == 200 and launched.task["num_nodes"] == 2
    assert launched.task["file_mounts"]["/broker-checkpoint"] == {"source": "s3://ckpt-bucket", "mode": "MOUNT"}
    assert "uv pip install" in launched.task["setup"] and "--no-deps" in launched.task["setup"]

    run_until(engine, lambda: bool(launched.jobs))
    job = launched.jobs[0]
    assert job.name == f"{job_id}-1"
    run = job.task["run"]
    assert "-m broker.agent --cloud auto" in run and '--node "$SKYPILOT_NODE_RANK"' in run
    assert "--broker-url http://broker.example:8080" in run and "--token" not in run
    # The agent reads its token from the secret's variable; it never appears on a command line.
    assert job.task["secrets"]["BROKER_AGENT_TOKEN"] == engine.parts.tokens(f"{job_id}-c1")
    assert engine.parts.tokens(f"{job_id}-c1") not in run
    assert "export BROKER_CHECKPOINT_DIR=/broker-checkpoint/train\n" in run

    rows = _clusters(store)
    assert len(rows[0].handle["instance_ids"]) == 2  # from SkyPilot's handle, for the SQS listener
    sky.finish_jobs("SUCCEEDED")
    run_until(engine, lambda: _job_state(store, job_id) == "SUCCEEDED" and not sky.clusters)
    assert sky.count("exec") == 1 and sky.count("down") == 1
    run_until(engine, lambda: _clusters(store)[0].state == "TERMINATED")


def test_capacity_error_moves_to_the_next_offer_and_records_the_zone(broker_home: Path, store: Store,
                                                                     skypilot: SkyStandIn) -> None:
    sky = skypilot
    sky.refuse("us-east-1a", "ResourcesUnavailableError", "Failed to acquire resources in all zones in us-east-1 "
               "for {AWS(p3.2xlarge)}. InsufficientInstanceCapacity")
    engine, _ = _engine(broker_home, store, sky)
    job_id = engine.submit(parse_job_spec(JOB, offline=True))
    run_until(engine, lambda: _job_state(store, job_id) == "RUNNING")

    first, second = _clusters(store)
    assert (first.zone, first.state) == ("us-east-1a", "FAILED")
    assert "ResourcesUnavailableError" in (first.reason or "")
    assert (second.zone, second.state) == ("us-west-2b", "UP")
    with store.transaction() as s:
        failed = s.scalars(select(JobEventRow).where(JobEventRow.kind == "launch_failed")).one()
        assert failed.detail["capacity"] is True and failed.detail["zone"] == "us-east-1a"


def test_other_launch_errors_fail_without_claiming_capacity(broker_home: Path, store: Store,
                                                            skypilot: SkyStandIn) -> None:
    sky = skypilot
    sky.refuse("us-east-1a", "InvalidClusterNameError", "Cluster name is invalid")
    engine, _ = _engine(broker_home, store, sky)
    job_id = engine.submit(parse_job_spec(JOB, offline=True))
    run_until(engine, lambda: any(c.state == "FAILED" for c in _clusters(store)))
    with store.transaction() as s:
        failed = s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id,
                                                     JobEventRow.kind == "launch_failed")).one()
        assert failed.detail["capacity"] is False


def test_a_launch_past_its_timeout_is_cancelled_and_fails(broker_home: Path, store: Store,
                                                          skypilot: SkyStandIn) -> None:
    sky = skypilot
    sky.launch_seconds = 0.0
    sky.hold()
    engine, _ = _engine(broker_home, store, sky, launch_timeout_s=1.0)
    job_id = engine.submit(parse_job_spec(JOB, offline=True))
    run_until(engine, lambda: any(c.state == "FAILED" for c in _clusters(store)))
    assert "took longer than" in (_clusters(store)[0].reason or "")
    run_until(engine, lambda: sky.count("api_cancel") >= 1)
    sky.release()
    first = f"broker-{job_id}-c1"
    (launch,) = [r for r in sky.requests.values() if (r.call, r.cluster) == ("launch", first)]
    _wait(launch.worked.is_set)
    assert launch.error is not None and launch.error.kind == "RequestCancelled"
    assert first not in sky.clusters  # the cancelled launch brought nothing up


def test_a_preempted_gang_is_lost_and_replaced_elsewhere(broker_home: Path, store: Store,
                                                         skypilot: SkyStandIn) -> None:
    sky = skypilot
    engine, _ = _engine(broker_home, store, sky)
    job_id = engine.submit(parse_job_spec(JOB, offline=True))
    run_until(engine, lambda: _job_state(store, job_id) == "RUNNING" and bool(sky.clusters[f"broker-{job_id}-c1"].jobs))
    sky.reclaim(f"broker-{job_id}-c1")
    run_until(engine, lambda: len(_clusters(store)) == 2 and _clusters(store)[0].state == "TERMINATED")
    first, second = _clusters(store)
    assert first.state == "TERMINATED" and "reclaimed" in (first.reason or "")
    assert second.zone != first.zone


def test_a_restarted_broker_adopts_its_clusters_and_tears_down_strays(broker_home: Path, store: Store,
                                                                      skypilot: SkyStandIn) -> None:
    sky = skypilot
    engine, _ = _engine(broker_home, store, sky)
    job_id = engine.submit(parse_job_spec(JOB, offline=True))
    name = f"broker-{job_id}-c1"
    run_until(engine, lambda: name in sky.clusters and bool(sky.clusters[name].jobs))
    # Left running by a broker that lost its state, and a user's own cluster.
    sky.add_up_cluster("broker-j-gone-c1")
    sky.add_up_cluster("my-dev-box")

    restarted, provisioner = _engine(broker_home, store, sky)  # a new process: no memory of requests
    assert provisioner.reconcile({c.id for c in _clusters(store)}, wait=5) == ["broker-j-gone-c1"]
    run_until(restarted, lambda: "broker-j-gone-c1" not in sky.clusters)
    assert "my-dev-box" in sky.clusters and name in sky.clusters
    sky.finish_jobs("SUCCEEDED")
    run_until(restarted, lambda: _job_state(store, job_id) == "SUCCEEDED")
    assert sky.count("exec") == 1 and sky.count("launch") == 1


def test_a_restart_mid_launch_waits_on_the_same_request(broker_home: Path, store: Store,
                                                       skypilot: SkyStandIn) -> None:
    sky = skypilot
    sky.hold()  # the launch is still running when the broker restarts
    engine, _ = _engine(broker_home, store, sky)
    job_id = engine.submit(parse_job_spec(JOB, offline=True))
    run_until(engine, lambda: bool(_clusters(store)) and "launch_request" in (_clusters(store)[0].handle or {}))
    restarted, _ = _engine(broker_home, store, sky)
    restarted.step()
    sky.release()
    run_until(restarted, lambda: _job_state(store, job_id) == "RUNNING")
    assert sky.count("launch") == 1
