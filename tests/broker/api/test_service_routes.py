"""Prices, reports, metrics and notices on the service's API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from broker.market.book import PriceBook
from broker.store.tables import ClusterRow, JobRow, LedgerRow, NoticeRow
from broker.tokens import token_digest
from providers.base import SpotQuote
from tests.broker.api.conftest import Api


def test_prices_are_empty_without_a_price_book(api: Api) -> None:
    response = api.client.get("/v1/prices", headers=api.alpha)
    assert response.status_code == 200 and response.json() == []
    assert api.client.get("/v1/prices").status_code == 401


def test_prices_are_the_latest_quote_per_offer(api: Api) -> None:
    t0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
    rows = [  # (cloud, zone, instance_type, accelerator, gpus, spot, observed_at)
        ("aws", "us-east-1a", "p3.2xlarge", "V100", 1, 0.95, t0),
        ("aws", "us-east-1a", "p3.2xlarge", "V100", 1, 0.91, t0 + timedelta(minutes=5)),
        ("gcp", "us-central1-a", "a2-highgpu-8g", "A100", 8, 9.5, t0),
    ]
    book = PriceBook(api.store)
    for cloud, zone, itype, acc, gpus, spot, at in rows:
        book.record(cloud, [SpotQuote(cloud, "r", zone, itype, acc, gpus, spot, 3.0, at, available_nodes=2)], at=at)
    quotes = api.client.get("/v1/prices", headers=api.beta).json()
    assert [(q["cloud"], q["zone"], q["spot_price"]) for q in quotes] == [
        ("aws", "us-east-1a", 0.91), ("gcp", "us-central1-a", 9.5)]  # cheapest per GPU-hour first
    only = api.client.get("/v1/prices", params={"accelerator": "v100"}, headers=api.beta).json()
    assert [(q["instance_type"], q["on_demand_price"], q["available_nodes"]) for q in only] == [("p3.2xlarge", 3.0, 2)]


def test_reports_cover_only_the_callers_team(api: Api) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    alpha_job = api.submit(api.alpha)
    with api.store.transaction() as s:
        s.add(ClusterRow(id="c9", launch_key="c9", job_id=alpha_job, backend="local", cloud="aws", region="r",
                         zone="z", instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1, spot=True,
                         price_per_node_hour=0.9, on_demand_price_per_node_hour=3.06, state="UP", handle={},
                         created_at=now - timedelta(minutes=5)))
        s.flush()
        team = s.get(JobRow, alpha_job).team  # type: ignore[union-attr]
        for minute in range(3):
            s.add(LedgerRow(cluster_id="c9", minute=now - timedelta(minutes=3 - minute), holder=f"job:{alpha_job}",
                            job_id=alpha_job, team=team, usage="running", cloud="aws", region="r", zone="z",
                            instance_type="p3.2xlarge", accelerator="V100", nodes=1, gpus=1, spot=True,
                            price_per_node_hour=0.9, on_demand_price_per_node_hour=3.06, cost=0.015,
                            on_demand_cost=0.051))
    mine = api.client.get("/v1/reports", params={"since": "1h"}, headers=api.alpha)
    theirs = api.client.get("/v1/reports", params={"since": "1h"}, headers=api.beta)
    assert mine.status_code == 200 and theirs.status_code == 200
    assert mine.json()["totals"]["spend"] == pytest.approx(0.045)
    assert theirs.json()["totals"]["spend"] == 0
    assert api.client.get("/v1/reports", params={"since": "soon"}, headers=api.alpha).status_code == 422
    assert api.client.get("/v1/reports").status_code == 401


def _metric(body: str, name: str) -> float:
    [line] = [ln for ln in body.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[-1])


def test_metrics_count_jobs_gpus_and_money_from_the_store(api: Api) -> None:
    job_id = api.submit(api.alpha)
    api.submit(api.alpha)
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    with api.store.transaction() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        job.state, job.preemptions, job.migrations = "RUNNING", 2, 1
        s.add(ClusterRow(id="c1", launch_key="c1", job_id=job_id, backend="local", cloud="aws", region="r",
                         zone="z", instance_type="p3.8xlarge", gpus_per_node=4, num_nodes=2, spot=True,
                         price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP", handle={},
                         created_at=now))
        s.flush()
        for minute, usage in ((0, "provisioning"), (1, "running")):
            s.add(LedgerRow(cluster_id="c1", minute=now + timedelta(minutes=minute), holder=f"job:{job_id}",
                            job_id=job_id, team="alpha", usage=usage, cloud="aws", region="r", zone="z",
                            instance_type="p3.8xlarge", nodes=2, gpus=8, spot=True, price_per_node_hour=1.0,
                            on_demand_price_per_node_hour=3.0, cost=1 / 30, on_demand_cost=3 / 30))
    body = api.client.get("/metrics").text
    assert _metric(body, 'broker_jobs{state="PENDING"}') == 1
    assert _metric(body, 'broker_jobs{state="RUNNING"}') == 1
    assert _metric(body, 'broker_gpus{usage="running"}') == 8  # the latest minute only
    assert _metric(body, 'broker_gpus{usage="provisioning"}') == 0
    assert _metric(body, "broker_preemptions_total") == 2
    assert _metric(body, "broker_migrations_total") == 1
    assert _metric(body, 'broker_spend_dollars_total{cloud="aws",team="alpha"}') == pytest.approx(2 / 30)
    assert _metric(body, 'broker_savings_dollars_total{cloud="aws",team="alpha"}') == pytest.approx(4 / 30)
    assert 'broker_http_request_seconds_count{method="POST",route="/v1/jobs",status="201"} 2.0' in body
    assert "bkr_" not in body


def test_a_forged_notice_for_another_cluster_changes_nothing(api: Api) -> None:
    job_id = api.submit(api.alpha)
    now = datetime.now(UTC)
    with api.store.transaction() as s:
        for cluster_id in ("c1", "c2"):
            s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, job_id=job_id, backend="local", cloud="aws",
                             region="r", zone="z", instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1,
                             spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP",
                             token_hash=token_digest(f"agent-{cluster_id}"), handle={}, created_at=now))
    notice = {"cluster_id": "c2", "kind": "terminate", "action_time": "2026-03-01T12:02:00Z"}
    forged = api.client.post("/v1/notices", json=notice, headers={"Authorization": "Bearer agent-c1"})
    team_token = api.client.post("/v1/notices", json=notice, headers=api.alpha)
    assert forged.status_code == 403 and team_token.status_code == 401
    with api.store.transaction() as s:
        assert s.scalar(select(func.count()).select_from(NoticeRow)) == 0
        assert [c.state for c in s.scalars(select(ClusterRow).order_by(ClusterRow.id))] == ["UP", "UP"]
        assert s.get(JobRow, job_id).state == "PENDING"  # type: ignore[union-attr]
    honest = api.client.post("/v1/notices", json=notice, headers={"Authorization": "Bearer agent-c2"})
    assert honest.status_code == 202
