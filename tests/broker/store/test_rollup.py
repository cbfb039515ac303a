"""The hourly ledger roll-up equals the ledger's minutes, whatever writes them and whatever is taken back."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import func, select, text, update

from broker.engine.metering import meter_cluster
from broker.reports.build import Window, build_report
from broker.store import Store, open_store
from broker.store.db import alembic_config
from broker.store.rollup import LedgerRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow
from providers.base import SpotQuote
from providers.local import LocalMarket
from providers.trace import read_trace, write_trace

T0 = datetime(2026, 1, 1, 10, 40, 17, tzinfo=UTC)  # mid-hour, mid-minute: the first minute is partial


def _expected(ledger: list[LedgerRow]) -> dict[tuple[Any, ...], list[float]]:
    sums: dict[tuple[Any, ...], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for r in ledger:
        hour = r.minute.replace(minute=0, second=0, microsecond=0)
        key = (r.cluster_id, hour, r.holder, r.job_id or "", r.team or "", r.usage, r.cloud, r.region, r.zone,
               r.instance_type, r.accelerator or "", bool(r.spot))
        total = sums[key]
        total[0] += 1
        total[1] += r.seconds
        total[2] += r.gpus * r.seconds / 60.0
        total[3] += r.cost
        total[4] += r.on_demand_cost
    return sums


def rollup_differences(store: Store) -> list[str]:
    """Every way the roll-up differs from the ledger summed here by hour (empty when they are equal)."""
    with store.transaction() as s:
        expected = _expected(list(s.scalars(select(LedgerRow))))
        rolled = {(r.cluster_id, r.hour, r.holder, r.job_id, r.team, r.usage, r.cloud, r.region, r.zone,
                   r.instance_type, r.accelerator, bool(r.spot)):
                   [r.pieces, r.seconds, r.gpu_minutes, r.cost, r.on_demand_cost]
                  for r in s.scalars(select(LedgerRollupRow))}
    wrong = [f"missing {k}" for k in expected.keys() - rolled.keys()]
    wrong += [f"extra {k} {rolled[k]}" for k in rolled.keys() - expected.keys()]
    for key in expected.keys() & rolled.keys():
        want, got = expected[key], rolled[key]
        close = all(abs(a - b) <= 1e-9 * max(1.0, abs(a)) for a, b in zip(want[1:], got[1:], strict=True))
        if want[0] != got[0] or not close:
            wrong.append(f"{key}: ledger {want} roll-up {got}")
    return wrong


def _market(tmp_path: Path) -> LocalMarket:
    path = tmp_path / "market.csv"
    write_trace(path, [SpotQuote("aws", "us-east-1", "us-east-1a", "p3.8xlarge", "V100", 4, 3.0 + (m % 7) / 10,
                                 12.24, T0 + timedelta(minutes=m), available_nodes=2) for m in range(0, 400, 5)])
    return LocalMarket(read_trace(path), T0)


def _cluster_with_two_jobs(store: Store) -> None:
    """A 4-GPU cluster: job a holds 2 GPUs from the start, job b 1 GPU for an hour; the rest is idle."""
    with store.transaction() as s:
        for job_id, team in (("a", "nlp"), ("b", "vision")):
            s.add(JobRow(id=job_id, name=job_id, team=team, state="RUNNING", priority=500, spec={}, backend="local",
                         num_nodes=1, gpus_per_node=1, checkpoint_dir="/c", created_at=T0, updated_at=T0, zones=[]))
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="k1", job_id="a", backend="local", cloud="aws", region="us-east-1",
                         zone="us-east-1a", instance_type="p3.8xlarge", accelerator="V100", gpus_per_node=4,
                         num_nodes=1, spot=True, price_per_node_hour=3.0, on_demand_price_per_node_hour=12.24,
                         state="UP", created_at=T0, up_at=T0 + timedelta(minutes=4), handle={}))
        s.flush()
        s.add(AllocationRow(job_id="a", cluster_id="c1", attempt=1, gpus={"0": [0, 1]}, started_at=T0,
                            running_at=T0 + timedelta(minutes=5)))
        s.add(AllocationRow(job_id="b", cluster_id="c1", attempt=1, gpus={"0": [2]},
                            started_at=T0 + timedelta(minutes=30), running_at=T0 + timedelta(minutes=31),
                            ended_at=T0 + timedelta(minutes=90), outcome="succeeded"))


def _meter(store: Store, market: LocalMarket, now: datetime) -> None:
    with store.transaction() as s:
        row = s.get(ClusterRow, "c1", with_for_update=True)
        assert row is not None
        meter_cluster(s, row, now, market)


def test_the_rollup_equals_the_metered_ledger_and_its_take_back(tmp_path: Path, db_url: str) -> None:
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        _cluster_with_two_jobs(store)
        for minutes in (7, 61, 150, 230):  # passes that end inside hours, as an engine's steps do
            _meter(store, market, T0 + timedelta(minutes=minutes, seconds=13))
            assert rollup_differences(store) == []
        with store.transaction() as s:
            hours = {r.hour for r in s.scalars(select(LedgerRollupRow))}
            usages = {r.usage for r in s.scalars(select(LedgerRollupRow))}
        assert len(hours) == 5 and {"provisioning", "running", "waiting"} <= usages
        # The cluster's end is learned late, before minutes already metered: they are taken back.
        ended = T0 + timedelta(minutes=100, seconds=40)
        with store.transaction() as s:
            row = s.get(ClusterRow, "c1")
            assert row is not None
            row.state, row.terminated_at = "TERMINATED", ended
        _meter(store, market, T0 + timedelta(minutes=231))
        assert rollup_differences(store) == []
        with store.transaction() as s:
            last = max(r.minute for r in s.scalars(select(LedgerRow)))
            assert max(r.hour for r in s.scalars(select(LedgerRollupRow))) == last.replace(minute=0, second=0,
                                                                                           microsecond=0)
        assert last < ended
        # Any other writer (a correction by hand) keeps it equal too.
        with store.transaction() as s:
            s.execute(update(LedgerRow).where(LedgerRow.holder == "job:b").values(cost=LedgerRow.cost * 2,
                                                                                   team="vision-2"))
        assert rollup_differences(store) == []
    finally:
        store.dispose()


@pytest.mark.parametrize("start, end", [
    (T0, T0 + timedelta(hours=4)),  # from the partial first minute
    (T0 + timedelta(minutes=19, seconds=43), T0 + timedelta(hours=3, minutes=1)),  # whole hours and two part-hours
    (datetime(2026, 1, 1, 11, tzinfo=UTC), datetime(2026, 1, 1, 13, tzinfo=UTC)),  # whole hours only
    (T0 + timedelta(minutes=25), T0 + timedelta(minutes=50)),  # inside one hour: minutes only
])
def test_a_report_from_the_rollup_equals_the_ledgers_minutes(tmp_path: Path, db_url: str, start: datetime,
                                                              end: datetime) -> None:
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        _cluster_with_two_jobs(store)
        _meter(store, market, T0 + timedelta(minutes=230))
        report = build_report(store, Window(start, end))
        with store.transaction() as s:
            rows = [r for r in s.scalars(select(LedgerRow)) if start <= r.minute < end]
        assert rows
        assert report.totals.spend == pytest.approx(sum(r.cost for r in rows), rel=1e-9, abs=1e-8)
        assert report.totals.on_demand == pytest.approx(sum(r.on_demand_cost for r in rows), rel=1e-9, abs=1e-8)
        gpu_hours = sum(r.gpus * r.seconds for r in rows) / 3600
        assert report.totals.gpu_hours == pytest.approx(gpu_hours, rel=1e-9, abs=1e-8)
        for team in ("nlp", "vision"):
            [group] = [g for g in report.groups["team"] if g.key == team] or [None]
            spent = sum(r.cost for r in rows if (r.team or "nlp") == team)  # idle GPUs: the launching job's team
            assert (group.figures.spend if group else 0.0) == pytest.approx(spent, rel=1e-9, abs=1e-8)
        by_day = sum(p.spend for p in report.daily)
        assert by_day == pytest.approx(report.totals.spend, rel=1e-9, abs=1e-8)
    finally:
        store.dispose()


def _downgrade(store: Store, revision: str) -> None:
    with store.engine.begin() as conn:
        config = alembic_config(store.url)
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def test_the_migration_rolls_up_a_ledger_written_before_it(tmp_path: Path, db_url: str) -> None:
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        _cluster_with_two_jobs(store)
        _downgrade(store, "0009_sharing")
        _meter(store, market, T0 + timedelta(minutes=170))  # written with no roll-up and no trigger
        store.migrate()
        assert rollup_differences(store) == []
        with store.transaction() as s:
            assert s.scalars(select(LedgerRollupRow)).first() is not None
    finally:
        store.dispose()


def test_the_migration_to_seconds_recounts_split_minutes(tmp_path: Path, db_url: str) -> None:
    """A roll-up that counted rows as minutes is recomputed from the ledger's seconds, and its triggers replaced."""
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        _cluster_with_two_jobs(store)
        _downgrade(store, "0012_early_setup")
        _meter(store, market, T0 + timedelta(minutes=120))  # rolled up by the old triggers: a row was a minute
        with store.transaction() as s:
            ledger = list(s.scalars(select(LedgerRow)))
            old = s.execute(text("SELECT sum(minutes) FROM ledger_rollup")).scalar_one()
        split = [r for r in ledger if r.seconds < 60]  # b's start and end (and c1's first minute) split minutes
        assert len(split) >= 4 and old == len(ledger)
        store.migrate()
        assert rollup_differences(store) == []
        with store.transaction() as s:
            seconds = s.scalar(select(func.sum(LedgerRollupRow.seconds)))
        assert seconds == pytest.approx(sum(r.seconds for r in ledger)) and seconds < 60 * len(ledger) - 60
        _meter(store, market, T0 + timedelta(minutes=170))  # the new triggers keep the seconds
        assert rollup_differences(store) == []
        _downgrade(store, "0012_early_setup")  # and the way back restores the old shape, still equal in count
        with store.transaction() as s:
            count = s.execute(text("SELECT sum(minutes) FROM ledger_rollup")).scalar_one()
            assert count == s.scalar(select(func.count()).select_from(LedgerRow))
        store.migrate()
        assert rollup_differences(store) == []
    finally:
        store.dispose()
