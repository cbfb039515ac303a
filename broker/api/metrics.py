"""``/metrics``: Prometheus figures read from the store at each scrape, so every replica agrees.

Job counts by state, GPUs of live clusters by what their latest metered minute was spent on
(``running`` is allocated, the rest are idle causes), preemptions, migrations, spend and savings
from the ledger, quotes in the price book, and this replica's request latencies and leadership.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import and_, func, inspect, select, text

from broker.api.gpu_metrics import GpuCollector
from broker.clock import Clock
from broker.config.teams import FairShareConfig
from broker.model import LIVE_CLUSTER_STATES, JobState, Usage
from broker.store import Store
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, NoticeRow, PriceQuoteRow

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StoreCollector(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        with self.store.transaction() as s:
            by_state = dict(s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all())
            preemptions, migrations = s.execute(select(func.coalesce(func.sum(JobRow.preemptions), 0),
                                                       func.coalesce(func.sum(JobRow.migrations), 0))).one()
            spend, on_demand = s.execute(select(func.coalesce(func.sum(LedgerRow.cost), 0.0),
                                                func.coalesce(func.sum(LedgerRow.on_demand_cost), 0.0))).one()
            latest = (select(LedgerRow.cluster_id, func.max(LedgerRow.minute).label("minute"))
                      .join(ClusterRow, ClusterRow.id == LedgerRow.cluster_id)
                      .where(ClusterRow.state.in_(LIVE_CLUSTER_STATES))
                      .group_by(LedgerRow.cluster_id).subquery())
            gpus = dict(s.execute(
                select(LedgerRow.usage, func.sum(LedgerRow.gpus))
                .join(latest, and_(LedgerRow.cluster_id == latest.c.cluster_id, LedgerRow.minute == latest.c.minute))
                .group_by(LedgerRow.usage)).all())
            live = dict(s.execute(select(ClusterRow.state, func.count()).where(
                ClusterRow.state.in_(LIVE_CLUSTER_STATES)).group_by(ClusterRow.state)).all())
            quotes = self._quotes(s)
            ages = self._ages(s)
        jobs = GaugeMetricFamily("broker_jobs", "Jobs by state", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], float(by_state.get(state.value, 0)))
        yield jobs
        clusters = GaugeMetricFamily("broker_clusters", "Live clusters by state", labels=["state"])
        for cluster_state in LIVE_CLUSTER_STATES:
            clusters.add_metric([cluster_state], float(live.get(cluster_state, 0)))
        yield clusters
        gauge = GaugeMetricFamily("broker_gpus", "GPUs of live clusters by use in their latest metered minute; "
                                  "running = allocated, the rest idle by cause", labels=["usage"])
        for usage in Usage:
            gauge.add_metric([usage.value], float(gpus.get(usage.value, 0)))
        yield gauge
        yield CounterMetricFamily("broker_preemptions", "Preemptions jobs met", value=float(preemptions))
        yield CounterMetricFamily("broker_migrations", "Migrations to a new cluster", value=float(migrations))
        yield CounterMetricFamily("broker_spend_dollars", "USD paid, from the ledger", value=float(spend))
        yield CounterMetricFamily("broker_savings_dollars", "USD saved against on-demand, from the ledger",
                                  value=float(on_demand) - float(spend))
        seen = GaugeMetricFamily("broker_price_quotes", "Quotes in the price book by cloud", labels=["cloud"])
        for cloud, count in sorted(quotes.items()):
            seen.add_metric([cloud], float(count))
        yield seen
        yield from ages

    def _ages(self, s: Any) -> list[Metric]:
        """Ages the alerting rules watch: a job stuck in a state, stale prices, a slow replacement."""
        now = datetime.now(UTC)
        stuck = GaugeMetricFamily("broker_job_state_age_seconds", "Seconds the longest-waiting job has been in "
                                  "each unfinished state", labels=["state"])
        for state, since in s.execute(select(JobRow.state, func.min(JobRow.updated_at)).where(
                JobRow.state.in_([st.value for st in JobState if not st.terminal])).group_by(JobRow.state)):
            stuck.add_metric([state], _age(now, since))
        prices = GaugeMetricFamily("broker_price_age_seconds", "Seconds since a cloud's prices were last confirmed",
                                   labels=["cloud"])
        if inspect(s.get_bind()).has_table("price_quotes"):
            for cloud, seen in s.execute(select(PriceQuoteRow.cloud, func.max(PriceQuoteRow.confirmed_at))
                                         .group_by(PriceQuoteRow.cloud)):
                prices.add_metric([cloud], _age(now, seen))
        slowest = 0.0
        for received, job_id in s.execute(select(NoticeRow.received_at, ClusterRow.job_id)
                                          .join(ClusterRow, ClusterRow.id == NoticeRow.cluster_id)
                                          .where(NoticeRow.received_at >= now - timedelta(hours=1)).limit(1000)):
            running = s.scalar(select(func.min(AllocationRow.running_at)).where(
                AllocationRow.job_id == job_id, AllocationRow.running_at > received))
            slowest = max(slowest, _age(running or now, received))
        replacement = GaugeMetricFamily("broker_notice_to_replacement_seconds", "Slowest notice-to-replacement "
                                        "(or wait so far) of notices in the last hour", value=slowest)
        return [stuck, prices, replacement]

    def _quotes(self, s: Any) -> dict[str, int]:
        if not inspect(s.get_bind()).has_table("price_quotes"):
            return {}
        return dict(s.execute(text("SELECT cloud, count(*) FROM price_quotes GROUP BY cloud")).all())


def _age(now: datetime, then: datetime | None) -> float:
    if then is None:
        return 0.0
    then = then if then.tzinfo else then.replace(tzinfo=UTC)
    return max((now - then).total_seconds(), 0.0)


def install_metrics(app: FastAPI, store: Store, is_leader: Callable[[], bool] | None, clock: Clock,
                    fair_share: FairShareConfig | None = None) -> None:
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    registry.register(GpuCollector(store, clock))
    if fair_share is not None:  # teams' shares, held and borrowed GPUs, budgets left (broker.api.teams)
        from broker.api.teams import TeamCollector

        registry.register(TeamCollector(store, clock, fair_share))
    latency = Histogram("broker_http_request_seconds", "API request latency", ["method", "route", "status"],
                        registry=registry)
    leader = Gauge("broker_leader", "1 when this replica holds the leader lock", registry=registry)
    leader.set_function(lambda: 1.0 if is_leader is not None and is_leader() else 0.0)

    @app.middleware("http")
    async def time_requests(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        began = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        latency.labels(request.method, path, str(response.status_code)).observe(time.perf_counter() - began)
        return response

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)
