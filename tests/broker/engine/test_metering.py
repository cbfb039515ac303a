"""The ledger bills every run to the second, with the clouds' one-minute minimum per launch.

A job that starts and ends inside one clock minute of a cluster that lives on is billed for the
seconds it held the GPUs (not as idle); a cluster whose life is shorter than a minute is billed a
minute, as the clouds bill an instance; and metering again, after a restart or on another replica,
writes nothing twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from broker.config.settings import load_settings
from broker.engine import metering
from broker.engine.metering import meter_cluster
from broker.reports.build import Window, build_report
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store import Store, open_store
from broker.store.db import Fence
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LeaderLeaseRow, LedgerRow
from providers.local import LocalMarket
from providers.trace import read_trace
from tests.broker.engine.one_zone import one_zone_market, run_until
from tests.ledger_checks import ledger_outside_cluster_life, ledger_tiles_cluster_life

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
PRICE = 3.67  # USD per node-hour of the one-zone market (p3.8xlarge, 4 V100)


def _cluster(cluster_id: str, created: datetime, ended: datetime | None, job_id: str | None = None) -> ClusterRow:
    return ClusterRow(id=cluster_id, launch_key=cluster_id, job_id=job_id, backend="local", cloud="aws",
                      region="us-east-1", zone="us-east-1a", instance_type="p3.8xlarge", accelerator="V100",
                      gpus_per_node=4, num_nodes=1, spot=True, price_per_node_hour=PRICE,
                      on_demand_price_per_node_hour=12.24, state="TERMINATED" if ended else "UP",
                      created_at=created, up_at=created, terminated_at=ended, handle={})


def _job(job_id: str) -> JobRow:
    return JobRow(id=job_id, name=job_id, team="ml", state="SUCCEEDED", spec={}, checkpoint_dir="/tmp/x",
                  num_nodes=1, gpus_per_node=4, zones=[], created_at=T0, updated_at=T0)


def _alloc(job_id: str, cluster_id: str, start: datetime, end: datetime, attempt: int = 1) -> AllocationRow:
    return AllocationRow(job_id=job_id, cluster_id=cluster_id, attempt=attempt, gpus={"0": [0, 1, 2, 3]},
                         started_at=start, running_at=start, ended_at=end, outcome="succeeded")


def _meter(store: Store, market: LocalMarket, cluster_id: str, now: datetime) -> int:
    with store.transaction() as s:
        row = s.get(ClusterRow, cluster_id, with_for_update=True)
        assert row is not None
        return meter_cluster(s, row, now, market)


def _ledger(store: Store) -> tuple[list[ClusterRow], list[LedgerRow]]:
    with store.transaction() as s:
        clusters = list(s.scalars(select(ClusterRow)))
        ledger = list(s.scalars(select(LedgerRow).order_by(LedgerRow.minute)))
        s.expunge_all()
    return clusters, ledger

def _whole_ledger(store: Store) -> list[tuple[object, ...]]:
    """The store's ledger rows, sorted, once each cluster's minutes are checked to tile its life."""
    clusters, ledger = _ledger(store)
    assert ledger_outside_cluster_life(clusters, ledger) == []
    assert ledger_tiles_cluster_life(clusters, ledger) == []
    return sorted((r.cluster_id, r.minute, r.holder, r.usage, r.gpus, r.seconds, round(r.cost, 9)) for r in ledger)



def _gpu_seconds(ledger: Sequence[LedgerRow], **match: str) -> float:
    return sum(r.gpus * r.seconds for r in ledger if all(getattr(r, k) == v for k, v in match.items()))


def _market(tmp_path: Path) -> LocalMarket:
    return LocalMarket(read_trace(one_zone_market(tmp_path / "m.csv", 2, 60, T0)), T0)


def test_a_run_inside_one_minute_of_a_live_cluster_is_billed_its_seconds(tmp_path: Path, db_url: str) -> None:
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            s.add(_cluster("c1", T0, T0 + timedelta(minutes=6)))
            s.add_all([_job("a"), _job("b")])
            s.flush()
            # a: 12:01:10-12:02:40, across a boundary; b: 12:03:10-12:03:40, inside one minute
            s.add_all([_alloc("a", "c1", T0 + timedelta(minutes=1, seconds=10), T0 + timedelta(minutes=2, seconds=40)),
                       _alloc("b", "c1", T0 + timedelta(minutes=3, seconds=10), T0 + timedelta(minutes=3, seconds=40))])
        _meter(store, market, "c1", T0 + timedelta(minutes=10))
        clusters, ledger = _ledger(store)
        assert _gpu_seconds(ledger, holder="job:a", usage="running") == pytest.approx(4 * 90)
        assert _gpu_seconds(ledger, holder="job:b", usage="running") == pytest.approx(4 * 30)
        assert _gpu_seconds(ledger) == pytest.approx(4 * 360)  # the cluster's six minutes, no more, no less
        assert sum(r.cost for r in ledger if r.job_id == "b") == pytest.approx(PRICE * 30 / 3600)
        assert sum(r.cost for r in ledger) == pytest.approx(PRICE * 6 / 60)
        assert ledger_outside_cluster_life(clusters, ledger) == []
        assert ledger_tiles_cluster_life(clusters, ledger) == []
        # Every piece of a clock minute is priced at that minute's quote, and a minute adds up to its price.
        per_minute: dict[datetime, float] = defaultdict(float)
        for r in ledger:
            per_minute[r.minute.replace(second=0)] += r.cost
        assert sorted(per_minute.values()) == pytest.approx([PRICE / 60] * 6)

        report = build_report(store, Window(T0, T0 + timedelta(minutes=6)))
        assert report.totals.gpu_hours == pytest.approx(4 * 6 / 60)
        assert report.totals.spend == pytest.approx(PRICE * 6 / 60)
        assert report.totals.useful_gpu_hours == pytest.approx(4 * 120 / 3600)
    finally:
        store.dispose()


def test_a_cluster_shorter_than_a_minute_is_billed_one_minute_once(tmp_path: Path, db_url: str) -> None:
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        created, ended = T0 + timedelta(seconds=40), T0 + timedelta(minutes=1, seconds=5)  # 25 s across a boundary
        with store.transaction() as s:
            s.add(_job("a"))
            s.flush()
            s.add(_cluster("c1", created, ended, job_id="a"))
            s.flush()
            s.add(_alloc("a", "c1", created + timedelta(seconds=5), created + timedelta(seconds=20)))
        assert _meter(store, market, "c1", T0 + timedelta(minutes=3)) > 0
        for _ in range(2):  # metered again (a re-run step, a restarted engine, another replica): nothing more
            assert _meter(store, market, "c1", T0 + timedelta(minutes=4)) == 0
        clusters, ledger = _ledger(store)
        assert _gpu_seconds(ledger) == pytest.approx(4 * 60)
        assert sum(r.cost for r in ledger) == pytest.approx(PRICE / 60)
        assert _gpu_seconds(ledger, holder="job:a", usage="running") == pytest.approx(4 * 15)
        assert ledger_outside_cluster_life(clusters, ledger) == []
        assert ledger_tiles_cluster_life(clusters, ledger) == []
        report = build_report(store, Window(T0, T0 + timedelta(minutes=5)))
        assert report.totals.spend == pytest.approx(PRICE / 60)
    finally:
        store.dispose()


def test_an_end_learned_late_takes_back_and_bills_the_minimum_once(tmp_path: Path, db_url: str) -> None:
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        created = T0 + timedelta(seconds=50)
        with store.transaction() as s:
            s.add(_cluster("c1", created, None))
        _meter(store, market, "c1", T0 + timedelta(minutes=3, seconds=10))  # believed alive to 12:03
        with store.transaction() as s:
            row = s.get(ClusterRow, "c1")
            assert row is not None
            row.state, row.terminated_at = "TERMINATED", created + timedelta(seconds=30)  # it was gone at 12:01:20
        _meter(store, market, "c1", T0 + timedelta(minutes=3, seconds=30))
        _meter(store, market, "c1", T0 + timedelta(minutes=4))
        clusters, ledger = _ledger(store)
        assert _gpu_seconds(ledger) == pytest.approx(4 * 60)
        assert ledger_outside_cluster_life(clusters, ledger) == []
        assert ledger_tiles_cluster_life(clusters, ledger) == []
    finally:
        store.dispose()


JOB = """\
name: {name}
resources:
  accelerators: V100:4
run: sleep {seconds}
"""


def _state(store: Store, job_id: str) -> str:
    with store.transaction() as s:
        return s.get(JobRow, job_id).state  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_engine_bills_short_runs_to_the_second_and_a_short_cluster_a_minute(
        tmp_path: Path, db_url: str) -> None:
    """Real engine, local backend, replayed market (10 market s a wall s): a pooled cluster serves a
    short job after the job it was launched for; then, with no pool, a short job's cluster goes at once."""
    settings = load_settings(market=one_zone_market(tmp_path / "m.csv", 2, 600), speed=10.0,
                             local_provision_seconds=5.0, max_gpus=4, pool_idle_seconds=60.0, db_url=db_url)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    store = engine.store
    try:
        ids = []
        for name in ("a", "b"):
            ids.append(engine.submit(parse_job_spec(JOB.format(name=name, seconds=1.5),
                                                    source=str(tmp_path / f"{name}.yaml"))))
            run_until(engine, lambda: _state(store, ids[-1]) == "SUCCEEDED")

        def all_metered() -> bool:
            with store.transaction() as s:
                return s.scalar(select(func.count()).select_from(ClusterRow).where(
                    (ClusterRow.terminated_at.is_(None)) | (ClusterRow.metered_until != ClusterRow.terminated_at))) == 0
        run_until(engine, all_metered, timeout=120)
        clusters, ledger = _ledger(store)
        assert len(clusters) == 1  # b ran on the cluster the pool kept
        with store.transaction() as s:
            allocations = list(s.scalars(select(AllocationRow)))
        for alloc in allocations:
            assert alloc.ended_at is not None
            held = (alloc.ended_at - alloc.started_at).total_seconds()
            billed = _gpu_seconds(ledger, holder=f"job:{alloc.job_id}", usage="running") / 4
            assert billed == pytest.approx(held), (alloc.job_id, alloc.started_at, alloc.ended_at)
        for c in clusters:
            assert c.terminated_at is not None
            life = (c.terminated_at - c.created_at).total_seconds()
            assert _gpu_seconds(ledger, cluster_id=c.id) / 4 == pytest.approx(max(life, 60.0))
        assert ledger_outside_cluster_life(clusters, ledger) == []
        assert ledger_tiles_cluster_life(clusters, ledger) == []
        count = len(ledger)
        for _ in range(3):  # the step run again: nothing billed twice
            metering.meter(store, engine.clock, engine.parts.market)
        assert len(_ledger(store)[1]) == count
    finally:
        broker.close()


@pytest.mark.slow
def test_the_engine_bills_a_cluster_gone_within_a_minute_one_minute(tmp_path: Path, db_url: str) -> None:
    settings = load_settings(market=one_zone_market(tmp_path / "m.csv", 2, 600), speed=10.0,
                             local_provision_seconds=5.0, max_gpus=4, db_url=db_url)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    store = engine.store
    try:
        job_id = engine.submit(parse_job_spec(JOB.format(name="a", seconds=0.5), source=str(tmp_path / "a.yaml")))
        run_until(engine, lambda: _state(store, job_id) == "SUCCEEDED")
        run_until(engine, lambda: all(c.metered_until is not None and c.metered_until == c.terminated_at
                                      for c in _ledger(store)[0]), timeout=120)
        clusters, ledger = _ledger(store)
        [c] = clusters
        assert c.terminated_at is not None
        life = (c.terminated_at - c.created_at).total_seconds()
        assert _gpu_seconds(ledger) / 4 == pytest.approx(max(life, 60.0)), life
        assert sum(r.cost for r in ledger) == pytest.approx(PRICE * max(life, 60.0) / 3600)
        with store.transaction() as s:
            [alloc] = list(s.scalars(select(AllocationRow)))
        assert alloc.ended_at is not None
        held = (alloc.ended_at - alloc.started_at).total_seconds()
        assert _gpu_seconds(ledger, holder=f"job:{job_id}", usage="running") / 4 == pytest.approx(held)
        assert ledger_tiles_cluster_life(clusters, ledger) == []
        count = len(ledger)
        metering.meter(store, engine.clock, engine.parts.market)
        assert len(_ledger(store)[1]) == count
    finally:
        broker.close()


class _At:
    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


def _fleet(store: Store) -> None:
    """Clusters each metered differently: live with a run, ended after a short one, launched for a job
    that moved in from another cluster, live and idle while a job waits, one a job is heading to."""
    with store.transaction() as s:
        s.add_all([_job(j) for j in "abcde"])
        s.flush()
        heading, waiting = s.get(JobRow, "d"), s.get(JobRow, "e")
        assert heading is not None and waiting is not None
        heading.state, heading.target_cluster_id, waiting.state = "PROVISIONING", "headed", "PENDING"
        s.add_all([_cluster("live", T0, None, "a"), _cluster("short", T0, T0 + timedelta(seconds=40), "b"),
                   _cluster("old", T0, T0 + timedelta(minutes=2), "c"),
                   _cluster("moved", T0 + timedelta(minutes=2), None, "c"), _cluster("idle", T0, None),
                   _cluster("headed", T0 + timedelta(seconds=30), None)])
        s.flush()
        s.add_all([_alloc("a", "live", T0 + timedelta(seconds=20), T0 + timedelta(minutes=3, seconds=5)),
                   _alloc("b", "short", T0 + timedelta(seconds=5), T0 + timedelta(seconds=35)),
                   _alloc("c", "old", T0, T0 + timedelta(minutes=1, seconds=50)),
                   _alloc("c", "moved", T0 + timedelta(minutes=2, seconds=30), T0 + timedelta(minutes=4), 2)])


def test_metering_a_fleet_at_once_writes_what_metering_each_cluster_alone_writes(tmp_path: Path) -> None:
    market = _market(tmp_path)
    together, alone = open_store(f"sqlite:///{tmp_path / 'together.db'}"), open_store(
        f"sqlite:///{tmp_path / 'alone.db'}")
    try:
        for store in (together, alone):
            _fleet(store)
        for minutes in (1, 3, 5):
            now = T0 + timedelta(minutes=minutes, seconds=10)
            metering.meter(together, _At(now), market)
            for cluster_id in ("headed", "idle", "live", "moved", "old", "short"):
                _meter(alone, market, cluster_id, now)
        rows = [_whole_ledger(store) for store in (together, alone)]
        assert rows[0] == rows[1]
        assert {r[3] for r in rows[0]} >= {"running", "restarting", "queue_drain", "unallocated"}
    finally:
        together.dispose()
        alone.dispose()


def test_metering_a_few_clusters_a_call_writes_every_minute_once(tmp_path: Path, db_url: str) -> None:
    """The step's bounded metering (``limit``): the least-metered clusters first, each written whole, so calls
    that meter two clusters each catch up on the fleet and write what metering it all at once writes; a
    call that stops partway (an engine killed between steps) leaves the rest due, nothing billed twice."""
    market = _market(tmp_path)
    together, chunked = open_store(f"sqlite:///{tmp_path / 'together.db'}"), open_store(db_url)
    try:
        for store in (together, chunked):
            _fleet(store)
        for minutes in (1, 3, 5):
            now = T0 + timedelta(minutes=minutes, seconds=10)
            due = metering.meter(together, _At(now), market)
            # two a call: as many calls as it takes meter each due cluster once (those metered least far first)
            calls = [metering.meter(chunked, _At(now), market, limit=2) for _ in range((due + 1) // 2)]
            assert due > 2 and max(calls) == 2 and sum(calls) == due
        rows = [_whole_ledger(store) for store in (together, chunked)]
        assert rows[0] == rows[1]
    finally:
        together.dispose()
        chunked.dispose()


def test_bounded_metering_takes_the_cluster_metered_least_far_first(tmp_path: Path, db_url: str) -> None:
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        with store.transaction() as s:
            s.add_all([_cluster("a", T0, None), _cluster("b", T0 + timedelta(minutes=2), None),
                       _cluster("c", T0 + timedelta(minutes=1), None)])
        now = T0 + timedelta(minutes=4, seconds=10)
        order = []
        for _ in range(3):
            assert metering.meter(store, _At(now), market, limit=1) == 1
            clusters, _ = _ledger(store)
            order.append(next(c.id for c in clusters if c.metered_until is not None and c.id not in order))
        assert order == ["a", "c", "b"]
        assert metering.meter(store, _At(now), market, limit=1) == 0
    finally:
        store.dispose()


def test_ledger_rows_metered_through_the_leaders_store_carry_its_epoch(tmp_path: Path, db_url: str) -> None:
    """The ledger's rows are inserted without the ORM (one executemany), so the fenced store's stamping of
    flushed rows does not see them: they take the transaction's epoch all the same, and outside a fenced
    store none."""
    market = _market(tmp_path)
    store = open_store(db_url)
    try:
        _fleet(store)
        with store.transaction() as s:
            lease = datetime.now(UTC) + timedelta(hours=1)
            s.merge(LeaderLeaseRow(name="engine", holder="me", epoch=5, expires_at=lease))
        now = T0 + timedelta(minutes=3, seconds=10)
        assert metering.meter(store.fenced(Fence("engine", "me", 5, lambda: True)), _At(now), market, limit=3) == 3
        assert metering.meter(store, _At(now), market) == 3
        clusters, ledger = _ledger(store)
        fenced = {c.id for c in clusters if c.epoch == 5}
        assert len(fenced) == 3  # the clusters metered under the lease (their metered_until moved by the ORM)
        assert {(r.cluster_id in fenced, r.epoch) for r in ledger} == {(True, 5), (False, None)}
    finally:
        store.dispose()
