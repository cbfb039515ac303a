"""``/metrics``: Prometheus figures read from the store at each scrape, and this replica's own.

Job counts by state, GPUs of live clusters by what their latest metered minute was spent on
(``running`` is allocated, the rest are idle causes), preemptions, migrations, spend and savings
from the ledger by team and cloud, each team's budget and its spend this period, report
deliveries, jobs ended in the last hour, quotes in the price book; and this replica's request
latencies, leadership and last engine step.

The store-derived families are the fleet's, not the replica's: only the leader exports them (a
lone broker with no leader election always does), so ``sum()`` over every replica's scrape counts
the fleet once. The replica's own families (latency, leadership, engine step) come from each.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

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
from broker.store.deliveries import ReportDeliveryRow
from broker.store.tables import (
    AllocationRow,
    ClusterRow,
    JobRow,
    LedgerRow,
    NoticeRow,
    PriceQuoteRow,
)

if TYPE_CHECKING:
    from broker.reports.settings import BudgetSettings

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineHeartbeat:
    """When this process's engine last finished a step, for the alert on an engine that stopped."""

    def __init__(self) -> None:
        self._at = 0.0

    def beat(self) -> None:
        self._at = time.time()

    def last(self) -> float:
        return self._at


engine_heartbeat = EngineHeartbeat()


class LeaderOnly(Collector):
    """Another collector's families, from the leader alone: the fleet counted once across replicas."""

    def __init__(self, inner: Collector, is_leader: Callable[[], bool] | None) -> None:
        self.inner, self.is_leader = inner, is_leader

    def collect(self) -> Iterator[Metric]:
        if self.is_leader is None or self.is_leader():
            yield from self.inner.collect()


class StoreCollector(Collector):
    def __init__(self, store: Store, clock: Clock, budgets: BudgetSettings | None = None) -> None:
        self.store, self.clock, self.budgets = store, clock, budgets

    def collect(self) -> Iterator[Metric]:
        with self.store.transaction() as s:
            by_state = dict(s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all())
            preemptions, migrations = s.execute(select(func.coalesce(func.sum(JobRow.preemptions), 0),
                                                       func.coalesce(func.sum(JobRow.migrations), 0))).one()
            money = s.execute(select(LedgerRow.team, LedgerRow.cloud, func.sum(LedgerRow.cost),
                                     func.sum(LedgerRow.on_demand_cost))
                              .group_by(LedgerRow.team, LedgerRow.cloud)).all()
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
            budgets = self._budgets(s)
            deliveries = dict(s.execute(select(ReportDeliveryRow.status, func.count())
                                        .group_by(ReportDeliveryRow.status)).all())
            hour_ago = self.clock.now() - timedelta(hours=1)
            ended = dict(s.execute(select(JobRow.state, func.count()).where(
                JobRow.finished_at >= hour_ago, JobRow.state.in_([st.value for st in JobState if st.terminal]))
                .group_by(JobRow.state)).all())
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
        spend = CounterMetricFamily("broker_spend_dollars", "USD paid, from the ledger, by the team that held "
                                    "the GPUs (empty: idle) and cloud", labels=["team", "cloud"])
        savings = CounterMetricFamily("broker_savings_dollars", "USD saved against on-demand, from the ledger, "
                                      "by team and cloud", labels=["team", "cloud"])
        for team, cloud, cost, on_demand in money:
            spend.add_metric([team or "", cloud], float(cost or 0.0))
            savings.add_metric([team or "", cloud], float(on_demand or 0.0) - float(cost or 0.0))
        yield spend
        yield savings
        yield from budgets
        sent = GaugeMetricFamily("broker_report_deliveries", "Report and budget-alert sends by status "
                                 "(failed: given up after retries)", labels=["status"])
        for status in ("pending", "sent", "failed"):
            sent.add_metric([status], float(deliveries.get(status, 0)))
        yield sent
        finished = GaugeMetricFamily("broker_jobs_ended_last_hour", "Jobs that ended in the last hour, by state",
                                     labels=["state"])
        for state in JobState:
            if state.terminal:
                finished.add_metric([state.value], float(ended.get(state.value, 0)))
        yield finished
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

    def _budgets(self, s: Any) -> list[Metric]:
        """Each budgeted team's budget, the seconds its period lasts and its spend so far this period."""
        budget = GaugeMetricFamily("broker_team_budget_dollars", "A team's budget in USD per period (settings)",
                                   labels=["team"])
        period = GaugeMetricFamily("broker_team_budget_period_seconds", "Seconds in the budget's period",
                                   labels=["team"])
        spent = GaugeMetricFamily("broker_team_period_spend_dollars", "USD a budgeted team spent this period, "
                                  "from the ledger", labels=["team"])
        if self.budgets is None or not self.budgets.teams:
            return []
        from broker.reports.build import period_start

        now = self.clock.now()
        start = period_start(now, self.budgets.period)
        seconds = {"day": 86400.0, "week": 7 * 86400.0, "month": 30 * 86400.0}[self.budgets.period]
        teams = sorted(self.budgets.teams)
        so_far = dict(s.execute(select(LedgerRow.team, func.sum(LedgerRow.cost)).where(
            LedgerRow.minute >= start, LedgerRow.team.in_(teams)).group_by(LedgerRow.team)).all())
        for team in teams:
            budget.add_metric([team], float(self.budgets.teams[team]))
            period.add_metric([team], seconds)
            spent.add_metric([team], float(so_far.get(team) or 0.0))
        return [budget, period, spent]

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
                    fair_share: FairShareConfig | None = None, budgets: BudgetSettings | None = None) -> None:
    registry = CollectorRegistry()
    registry.register(LeaderOnly(StoreCollector(store, clock, budgets), is_leader))
    registry.register(LeaderOnly(GpuCollector(store, clock), is_leader))
    if fair_share is not None:  # teams' shares, held and borrowed GPUs, budgets left (broker.api.teams)
        from broker.api.teams import TeamCollector

        registry.register(LeaderOnly(TeamCollector(store, clock, fair_share), is_leader))
    latency = Histogram("broker_http_request_seconds", "API request latency", ["method", "route", "status"],
                        registry=registry)
    leader = Gauge("broker_leader", "1 when this replica holds the leader lock", registry=registry)
    leader.set_function(lambda: 1.0 if is_leader is not None and is_leader() else 0.0)
    stepped = Gauge("broker_engine_last_step_timestamp_seconds", "Unix time this replica's engine last "
                    "finished a step (0: it has not stepped; only the leader steps)", registry=registry)
    stepped.set_function(engine_heartbeat.last)

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
