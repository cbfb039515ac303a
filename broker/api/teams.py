"""``GET /v1/teams``: each team's share owed, GPUs held and borrowed, queue, usage, budget left and reclaims."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Depends
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.clock import Clock
from broker.config.teams import FairShareConfig
from broker.status.teams import team_lines
from broker.store import Store


def teams_router(store: Store, clock: Clock, config: FairShareConfig, team_of: Any) -> APIRouter:
    router = APIRouter(tags=["teams"])

    @router.get("/v1/teams")
    def teams(team: str = Depends(team_of)) -> dict[str, Any]:
        """Every team the broker knows: share owed and GPUs held now, borrowed, queued and waiting jobs, recent
        usage (GPU-hours, decayed), budget left this period, reclaims given and taken, work lost to them."""
        return {"capacity_gpus": config.capacity_gpus,
                "teams": [line.as_dict() for line in team_lines(store, config, clock.now())]}

    return router


class TeamCollector(Collector):
    """The same figures for Prometheus, read from the store at each scrape."""

    def __init__(self, store: Store, clock: Clock, config: FairShareConfig) -> None:
        self.store, self.clock, self.config = store, clock, config

    def collect(self) -> Iterator[Metric]:
        lines = team_lines(self.store, self.config, self.clock.now())
        gauges = {
            "owed_gpus": GaugeMetricFamily("broker_team_owed_gpus", "GPUs a team's share is now", labels=["team"]),
            "held_gpus": GaugeMetricFamily("broker_team_held_gpus", "GPUs a team's started jobs hold", labels=["team"]),
            "borrowed_gpus": GaugeMetricFamily("broker_team_borrowed_gpus", "GPUs a team holds past its share",
                                               labels=["team"]),
            "waiting": GaugeMetricFamily("broker_team_jobs_waiting", "Queued jobs fair share or a budget holds back",
                                         labels=["team"]),
            "usage_gpu_hours": GaugeMetricFamily("broker_team_usage_gpu_hours", "Recent GPU-hours, decayed",
                                                 labels=["team"]),
        }
        budget = GaugeMetricFamily("broker_team_budget_left_dollars", "USD left of an enforced budget this period",
                                   labels=["team"])
        given = CounterMetricFamily("broker_team_reclaims_given", "Jobs of a team that gave borrowed GPUs back",
                                    labels=["team"])
        for line in lines:
            for key, gauge in gauges.items():
                gauge.add_metric([line.team], float(getattr(line, key)))
            if line.budget_left is not None:
                budget.add_metric([line.team], line.budget_left)
            given.add_metric([line.team], float(line.reclaims_given))
        yield from gauges.values()
        yield budget
        yield given
