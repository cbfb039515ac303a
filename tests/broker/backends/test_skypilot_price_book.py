"""The engine on the SkyPilot backend decides on the price book and bills at its prices as they move.

SkyPilot's API server is the stand-in (``tests/skystandin``); the market is the real price book over the
real store, fed as the pollers feed it; the clock runs at 60x so minutes pass in seconds.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.backends.skypilot.provisioner import SkyPilotOptions, SkyPilotProvisioner
from broker.backends.skypilot.runtime import store_specs
from broker.clock import AcceleratedClock
from broker.engine import Engine, EngineOptions
from broker.engine.machine import submit_job
from broker.market.book import PriceBook
from broker.market.price_market import PriceBookMarket
from broker.spec.job import parse_job_spec
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow, LedgerRow
from broker.tokens import SharedAgentTokens
from providers.base import SpotQuote
from tests.broker.engine.one_zone import run_until
from tests.skystandin.server import SkyStandIn

JOB = "name: train\nnum_nodes: 2\nresources:\n  accelerators: V100:1\nrun: python train.py\n"


def quotes(east: float, west: float, gcp: float, at: datetime) -> dict[str, list[SpotQuote]]:
    return {
        "aws": [SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, east, 3.06, at),
                SpotQuote("aws", "us-west-2", "us-west-2b", "p3.2xlarge", "V100", 1, west, 3.06, at)],
        "gcp": [SpotQuote("gcp", "us-central1", "us-central1-a", "n1-highmem-8", "V100", 1, gcp, 2.95, at)],
    }


def clusters(store: Store) -> list[ClusterRow]:
    with store.transaction() as s:
        rows = list(s.scalars(select(ClusterRow).order_by(ClusterRow.created_at)))
        s.expunge_all()
        return rows


def test_the_book_picks_the_zone_and_the_ledger_follows_its_price_changes(tmp_path: Path, skypilot: SkyStandIn) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    clock = AcceleratedClock.starting_now(60.0)
    book = PriceBook(store)
    start = clock.now()
    for cloud, listed in quotes(east=1.10, west=0.80, gcp=1.30, at=start).items():
        book.record(cloud, listed, at=start)
    sky = skypilot
    provisioner = SkyPilotProvisioner(tmp_path, store_specs(store), SkyPilotOptions(refresh_s=0.05), sdk=sky.sdk())
    engine = Engine(store, clock, PriceBookMarket(book), provisioner,
                    EngineOptions(home=tmp_path, broker_url="http://broker.example:8080"),
                    tokens=SharedAgentTokens(store, tmp_path))
    try:
        job_id = submit_job(store, clock, parse_job_spec(JOB, offline=True), tmp_path, "skypilot")
        run_until(engine, lambda: any(c.state == "UP" for c in clusters(store)))
        (first,) = clusters(store)
        assert (first.zone, first.price_per_node_hour) == ("us-west-2b", 0.80)  # the book's cheapest
        changed = clock.now().replace(second=0, microsecond=0) + timedelta(minutes=2)
        for cloud, listed in quotes(east=1.60, west=1.20, gcp=1.70, at=changed).items():
            book.record(cloud, listed, at=changed)  # every zone dearer; us-west-2b still the cheapest
        run_until(engine, lambda: clock.now() > changed + timedelta(minutes=3)
              and any(c.jobs for c in sky.clusters.values()), timeout=60)
        sky.finish_jobs()
        run_until(engine, lambda: engine_done(store, job_id))
        with store.transaction() as s:
            rows = list(s.scalars(select(LedgerRow).where(LedgerRow.cluster_id == first.id)
                                  .order_by(LedgerRow.minute)))
        before = {r.price_per_node_hour for r in rows if r.minute < changed}
        after = {r.price_per_node_hour for r in rows if r.minute >= changed}
        assert before == {0.80} and after == {1.20}
        assert all(r.on_demand_price_per_node_hour == 3.06 for r in rows)
    finally:
        store.dispose()


def engine_done(store: Store, job_id: str) -> bool:
    with store.transaction() as s:
        job = s.get(JobRow, job_id)
        return job is not None and job.state == "SUCCEEDED"


CPU_JOB = "name: etl\nresources:\n  cpus: 8+\n  memory: 32+\nrun: python etl.py\n"


@pytest.mark.slow
def test_a_cpu_task_goes_to_the_cheapest_spot_cpu_instance_the_pollers_quoted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skypilot: SkyStandIn) -> None:
    """The real AWS and GCP pollers, against the stand-in clouds in their wire formats, bring back
    the catalog's CPU-only types spot and on-demand; a `cpus: 8+ memory: 32+` task is launched on
    the cheapest spot one of them that holds it, as the task SkyPilot is handed says."""
    from google.auth.credentials import AnonymousCredentials

    from broker.market.polling import poll_prices
    from providers import catalog
    from providers.aws import AwsPriceSource
    from providers.fetching import Backoff
    from providers.gcp import GcpPriceSource
    from tests.fakeclouds.market import fake_clouds

    fast = Backoff(attempts=3, base_seconds=0.01, max_seconds=0.02)
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    book = PriceBook(store)
    with fake_clouds() as clouds:
        env = clouds.environment()
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, env[name])
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        polls = poll_prices(book, {
            "aws": AwsPriceSource(regions=["us-east-1", "us-west-2"], ec2_endpoint=env["AWS_ENDPOINT_URL_EC2"],
                                  pricing_endpoint=env["AWS_ENDPOINT_URL_PRICING"], backoff=fast),
            "gcp": GcpPriceSource(project="p", regions=["us-central1"],
                                  compute_endpoint=env["BROKER_GCP_COMPUTE_ENDPOINT"],
                                  billing_endpoint=env["BROKER_GCP_BILLING_ENDPOINT"],
                                  credentials=AnonymousCredentials(), backoff=fast),
        })
    assert [p.status for p in polls] == ["ok", "ok"]
    cpu = [q for q in book.latest() if q.gpus_per_node == 0]
    assert {q.cloud for q in cpu} == {"aws", "gcp"}
    assert all(q.spot_price and q.on_demand_price and q.spot_price < q.on_demand_price for q in cpu)
    assert {q.instance_type for q in cpu} <= {t.name for t in catalog.cpu_instance_types()}

    def holds(q: SpotQuote) -> bool:
        shape = catalog.find_any(q.instance_type, q.cloud)
        return shape is not None and shape.vcpus >= 8 and shape.memory_gb >= 32

    cheapest = min((q for q in cpu if holds(q)), key=lambda q: q.spot_price or 0.0)
    # smaller types are cheaper still: the shape decides, not the price alone
    assert any(not holds(q) and (q.spot_price or 0.0) < (cheapest.spot_price or 0.0) for q in cpu)
    clock = AcceleratedClock.starting_now(60.0)
    sky = skypilot
    provisioner = SkyPilotProvisioner(tmp_path, store_specs(store), SkyPilotOptions(refresh_s=0.05), sdk=sky.sdk())
    engine = Engine(store, clock, PriceBookMarket(book), provisioner,
                    EngineOptions(home=tmp_path, broker_url="http://broker.example:8080"),
                    tokens=SharedAgentTokens(store, tmp_path))
    try:
        submit_job(store, clock, parse_job_spec(CPU_JOB, offline=True), tmp_path, "skypilot")
        run_until(engine, lambda: any(c.state == "UP" for c in clusters(store)))
        (first,) = clusters(store)
        assert (first.cloud, first.zone, first.instance_type, first.spot) == \
            (cheapest.cloud, cheapest.zone, cheapest.instance_type, True)
        assert first.price_per_node_hour == cheapest.spot_price
        (launched,) = sky.clusters.values()
        resources = launched.task["resources"]
        assert resources["instance_type"] == cheapest.instance_type and resources["use_spot"] is True
        assert "accelerators" not in resources
    finally:
        store.dispose()
