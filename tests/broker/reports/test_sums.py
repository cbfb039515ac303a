"""The report's sums grouped in the database equal the ledger's rows summed one by one in Python."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from broker.reports.build import NO_TEAM, Window, build_report
from broker.reports.model import DIMENSIONS, IDLE_KEY, Report
from broker.store import Store
from broker.store.tables import ClusterRow, JobRow
from tests.broker.reports.ledger import DEMO_START, LedgerWriter

WINDOWS = [  # each checked for all teams and for each team
    Window(DEMO_START, DEMO_START + timedelta(days=4)),  # everything, whole hours: the roll-up alone
    # Part-hours at both ends (minutes from the ledger), j-llm caught before its migration.
    Window(DEMO_START + timedelta(hours=2, minutes=17), DEMO_START + timedelta(hours=10, minutes=43)),
    Window(DEMO_START + timedelta(hours=9, minutes=50), DEMO_START + timedelta(hours=41, minutes=5)),
    Window(DEMO_START + timedelta(minutes=3), DEMO_START + timedelta(minutes=40)),  # inside one hour
]


def _key(dimension: str, row: dict[str, Any], team: str) -> str:
    return {"job": row["job_id"] or IDLE_KEY, "team": team, "cloud": row["cloud"],
            "region": f"{row['cloud']}/{row['region']}", "gpu": row["accelerator"] or row["instance_type"]}[dimension]


def expected(store: Store, rows: list[dict[str, Any]], window: Window, team: str | None) -> dict[str, Any]:
    """Totals and groupings summed row by row: the report's rules written out plainly."""
    with store.transaction() as s:
        owner = {c: t for c, t in s.execute(select(ClusterRow.id, JobRow.team)
                                            .outerjoin(JobRow, JobRow.id == ClusterRow.job_id))}
        counters = {j: (p, m, w) for j, p, m, w in s.execute(
            select(JobRow.id, JobRow.preemptions, JobRow.migrations, JobRow.work_lost_s))}
    flows: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    per_job: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    where: dict[tuple[str, str], dict[str, str]] = {}
    for row in rows:
        row_team = row["team"] or owner.get(row["cluster_id"]) or NO_TEAM
        if not window.start <= row["minute"] < window.end or (team is not None and row_team != team):
            continue
        gpu_minutes = row["gpus"]  # a whole minute each (the default 60 seconds)
        for dimension in ("total", *DIMENSIONS):
            figures = flows[(dimension, "" if dimension == "total" else _key(dimension, row, row_team))]
            figures["spend"] += row["cost"]
            figures["on_demand"] += row["on_demand_cost"]
            figures["gpu_hours"] += gpu_minutes / 60
            figures[row["usage"]] += gpu_minutes / 60
        if row["job_id"]:
            per_job[row["job_id"]][row["cluster_id"]] += gpu_minutes
            where[(row["job_id"], row["cluster_id"])] = {d: _key(d, row, row_team) for d in DIMENSIONS}
    for job_id, clusters in per_job.items():
        dominant = min(clusters, key=lambda c: (-clusters[c], c))
        for dimension in ("total", *DIMENSIONS):
            figures = flows[(dimension, "" if dimension == "total" else where[(job_id, dominant)][dimension])]
            figures["jobs"] += 1
            figures["preemptions"] += counters[job_id][0]
            figures["migrations"] += counters[job_id][1]
            figures["work_lost_s"] += counters[job_id][2]
    return {f"{d}:{k}": dict(v) for (d, k), v in flows.items()}


def actual(report: Report) -> dict[str, Any]:
    out = {}
    for name, f in [("total:", report.totals),
                    *((f"{d}:{g.key}", g.figures) for d, groups in report.groups.items() for g in groups)]:
        figures = {"spend": f.spend, "on_demand": f.on_demand, "gpu_hours": f.gpu_hours,
                   "running": f.useful_gpu_hours, **f.idle_gpu_hours}
        figures.update({k: v for k, v in (("jobs", f.jobs), ("preemptions", f.preemptions),
                                          ("migrations", f.migrations), ("work_lost_s", f.work_lost_s)) if v})
        out[name] = {k: v for k, v in figures.items() if v}
    return out


def test_grouped_in_the_database_equals_the_rows_summed_one_by_one(demo: tuple[Store, LedgerWriter]) -> None:
    store, writer = demo
    for window in WINDOWS:
        for team in (None, "nlp", "vision"):
            report = build_report(store, window, team=team)
            want = {k: {f: v for f, v in figures.items() if v}
                    for k, figures in expected(store, writer.rows, window, team).items()}
            want.setdefault("total:", {})
            got = actual(report)
            assert got.keys() == want.keys(), (window, team)
            for key, figures in want.items():
                assert got[key] == pytest.approx(figures), (window, team, key)
            if team is None:
                days: dict[tuple[str, str], float] = defaultdict(float)
                for r in writer.rows:
                    if window.start <= r["minute"] < window.end:
                        days[(r["minute"].date().isoformat(), r["cloud"])] += r["cost"]
                assert {(p.day, p.cloud): p.spend for p in report.daily} == pytest.approx(dict(days)), window


@pytest.mark.parametrize("team", [None, "vision"])
def test_fewer_groupings_leave_every_other_figure_the_same(demo: tuple[Store, LedgerWriter], team: str | None) -> None:
    store, _ = demo
    window = WINDOWS[2]
    full = build_report(store, window, team=team, now=DEMO_START).to_dict()
    part = build_report(store, window, team=team, now=DEMO_START, dimensions=("team", "gpu")).to_dict()
    assert set(part.pop("groups")) == {"team", "gpu"}
    groups = full.pop("groups")
    assert part == full
    again = build_report(store, window, team=team, now=DEMO_START, dimensions=("team", "gpu"))
    assert [g.to_dict() for g in again.groups["gpu"]] == groups["gpu"]


def test_an_unknown_grouping_is_refused(demo: tuple[Store, LedgerWriter]) -> None:
    with pytest.raises(ValueError, match="unknown report groupings"):
        build_report(demo[0], WINDOWS[0], dimensions=("team", "zone"))
