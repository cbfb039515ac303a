"""The ledger's running minutes split by what the GPUs did, worked by hand, on SQLite and PostgreSQL.

One node of 2 GPUs, one job holding both for 8 minutes at 0.04 $ a node-minute. Its agent
measured (mean utilisation, both GPUs unless said):

    minute 0, 1: 2 %          before its first progress report (at 2:00)      -> startup, 2 GPUs
    minute 2:    95 % and 3 %                                                 -> stalled, 1 GPU
    minute 3:    90 %                                                         -> running
    minute 4, 5: 1 %          checkpoint asked at 4:00, written at 5:30       -> checkpoint, 2 GPUs
    minute 6:    0 %                                                          -> stalled, 2 GPUs
    minute 7:    nothing reported                                             -> running, not measured

So, in GPU-minutes: startup 4, checkpoint 4, stalled 3, useful 5 (of which 2 unmeasured), 16 in
all; and every minute's rows still add up to the node's 2 GPUs and 0.04 $.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.api.gpu_reports import add_to_rollup
from broker.engine.cadence import ASKED
from broker.engine.gpu_attribution import attribute, settled
from broker.engine.metering import meter_cluster
from broker.reports.build import Window, build_report
from broker.reports.render import render_text, summary_lines
from broker.store import Store, open_store
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import (
    AllocationRow,
    CheckpointReportRow,
    ClusterRow,
    JobEventRow,
    JobRow,
    LedgerRow,
    ProgressRow,
)
from providers.base import SpotQuote
from providers.local import LocalMarket
from providers.trace import read_trace, write_trace

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
PRICE = 2.4  # USD per node-hour: 0.04 a node-minute
UTIL = {0: (2, 2), 1: (2, 2), 2: (95, 3), 3: (90, 90), 4: (1, 1), 5: (1, 1), 6: (0, 0)}


def _at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _setup(tmp_path: Path, db_url: str) -> tuple[Store, LocalMarket]:
    path = tmp_path / "market.csv"
    write_trace(path, [SpotQuote("aws", "us-east-1", "us-east-1a", "g5.12xlarge", "A10G", 2, PRICE, 6.0, _at(m),
                                 available_nodes=1) for m in range(10)])
    store = open_store(db_url)
    with store.transaction() as s:
        s.add(JobRow(id="j", name="train", team="ml", state="SUCCEEDED", priority=500, spec={"run": "x"},
                     backend="local", num_nodes=1, gpus_per_node=2, checkpoint_dir="ckpt", created_at=T0,
                     updated_at=T0, zones=[], attempt=1, accelerator="A10G"))
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="k1", job_id="j", backend="local", cloud="aws", region="us-east-1",
                         zone="us-east-1a", instance_type="g5.12xlarge", accelerator="A10G", gpus_per_node=2,
                         num_nodes=1, spot=True, price_per_node_hour=PRICE, on_demand_price_per_node_hour=6.0,
                         state="TERMINATED", created_at=T0, up_at=T0, terminated_at=_at(8), handle={}))
        s.flush()
        s.add(AllocationRow(job_id="j", cluster_id="c1", attempt=1, gpus={"0": [0, 1]}, started_at=T0, running_at=T0,
                            ended_at=_at(8), outcome="succeeded"))
        s.add(JobEventRow(job_id="j", at=_at(4), kind=ASKED, detail={}))
        s.add(CheckpointReportRow(job_id="j", cluster_id="c1", node="0", path="step-40", step=40,
                                  written_at=_at(5.5), received_at=_at(5.5)))
    return store, LocalMarket(read_trace(path), T0)


def _report_minutes(store: Store, minutes: range, gpus: tuple[int, ...] = (0, 1)) -> None:
    """What the API stores for these minutes (its roll-up too)."""
    with store.transaction() as s:
        rows = [GpuMinuteRow(job_id="j", attempt=1, cluster_id="c1", node="0", gpu=gpu, uuid=f"GPU-{gpu}",
                             started_at=_at(m), ended_at=_at(m + 1), samples=12, seconds=60.0,
                             utilization_mean=float(UTIL[m][gpu]),
                             utilization_max=float(UTIL[m][gpu]), memory_used_mb_max=10000.0 + 1000 * m,
                             memory_total_mb=24576.0, received_at=_at(m + 1))
                for m in minutes for gpu in gpus]
        s.add_all(rows)
        add_to_rollup(s, "j", "0", rows)


def _ledger(store: Store) -> list[LedgerRow]:
    with store.transaction() as s:
        return list(s.scalars(select(LedgerRow)))


def test_idle_gpus_inside_a_running_job_are_held_idle_by_part(tmp_path: Path, db_url: str) -> None:
    store, market = _setup(tmp_path, db_url)
    _report_minutes(store, range(0, 2))
    assert attribute(store, 0.10, _at(9)) == 0  # the ledger has not reached those minutes: they wait
    with store.transaction() as s:
        row = s.get(ClusterRow, "c1")
        assert row is not None
        meter_cluster(s, row, _at(9), market)
    assert attribute(store, 0.10, _at(9)) == 4
    # No progress report yet: idle taken as stalled, until the first report says it was startup.
    assert {r.usage for r in _ledger(store) if r.holder == "held_idle:j"} == {"held_idle_stalled"}
    with store.transaction() as s:
        s.add(ProgressRow(job_id="j", attempt=1, step=1, total=100, at=_at(2)))
    _report_minutes(store, range(2, 6))
    _report_minutes(store, range(6, 7), gpus=(0,))
    assert attribute(store, 0.10, _at(9)) == 9
    # GPU 1 of minute 6 comes in a later report (as another node's would): the minute is split anew.
    assert {r.holder: r.gpus for r in _ledger(store) if r.minute == _at(6)} == {"job:j": 1.0, "held_idle:j": 1.0}
    _report_minutes(store, range(6, 7), gpus=(1,))
    assert attribute(store, 0.10, _at(9)) == 1
    assert attribute(store, 0.10, _at(9)) == 0  # each minute once

    per_minute: dict[int, dict[str, tuple[str, float]]] = defaultdict(dict)
    cost: dict[int, float] = defaultdict(float)
    for r in _ledger(store):
        minute = int((r.minute - T0).total_seconds() // 60)
        per_minute[minute][r.holder] = (r.usage, round(r.gpus, 9))
        cost[minute] += r.cost
    idle = "held_idle:j"
    assert dict(per_minute) == {
        0: {idle: ("held_idle_startup", 2.0)}, 1: {idle: ("held_idle_startup", 2.0)},
        2: {"job:j": ("running", 1.0), idle: ("held_idle_stalled", 1.0)},
        3: {"job:j": ("running", 2.0)},
        4: {idle: ("held_idle_checkpoint", 2.0)}, 5: {idle: ("held_idle_checkpoint", 2.0)},
        6: {idle: ("held_idle_stalled", 2.0)},
        7: {"job:j": ("running", 2.0)},
    }
    assert all(c == pytest.approx(PRICE / 60) for c in cost.values())

    report = build_report(store, Window(T0, _at(8)))
    t = report.totals
    assert t.gpu_hours == pytest.approx(16 / 60)
    assert t.useful_gpu_hours == pytest.approx(5 / 60)
    assert t.idle_gpu_hours["held_idle"] == pytest.approx(11 / 60)
    assert t.idle_cost["held_idle"] == pytest.approx(11 / 16 * 8 * PRICE / 60)
    assert t.held_idle_parts == pytest.approx({"startup": 4 / 60, "checkpoint": 4 / 60, "stalled": 3 / 60})
    assert t.measured_gpu_hours == pytest.approx(14 / 60)
    assert t.unmeasured_gpu_hours == pytest.approx(2 / 60)
    data = report.to_dict()["totals"]
    assert data["idle_gpu_hours"]["held_idle"] == pytest.approx(11 / 60)
    assert set(data["held_idle_parts"]) == {"startup", "checkpoint", "stalled"}
    assert data["unmeasured_gpu_hours"] == pytest.approx(2 / 60)
    held = [w for w in report.wastes if w.cause == "held_idle"]
    assert len(held) == 1 and held[0].where == "job j train (team ml)"
    assert held[0].suggestion.startswith("Job j train (team ml) held 0.2 GPU-h ($0.22) of GPUs measured idle")
    assert "startup 0.1, checkpoint 0.1, stalled 0.1" in held[0].suggestion
    assert "Held idle by running jobs (GPUs measured idle): 0.2 GPU-h ($0.22): startup 0.1, checkpoint 0.1, " \
           "stalled 0.1" in summary_lines(report)
    # Right-sizing: 290 utilisation-minutes over 14 measured GPU-minutes = 20.7 % busy on 2 GPUs:
    # ceil(2 * 0.207 / 0.8) = 1 GPU would do, saving half the job's 0.32 $.
    assert report.right_sizing == [{"job_id": "j", "label": "train (ml)", "runs": 1, "suggestions": [{
        "kind": "fewer_gpus", "saving": pytest.approx(0.16), "slower": 1.0,
        "text": "its 2 GPUs were 21% busy: 1 would have been 41% busy, saving $0.16 where its work divides "
                "across fewer GPUs"}]}]
    assert "- train (ml) [j]: its 2 GPUs were 21% busy" in render_text(report)
    # Whole hours come from the roll-ups: the same figures.
    wide = build_report(store, Window(T0 - timedelta(hours=1), T0 + timedelta(hours=2))).totals
    assert wide.measured_gpu_hours == pytest.approx(14 / 60)
    assert wide.held_idle_parts == pytest.approx(t.held_idle_parts)
    assert build_report(store, Window(T0, _at(8)), team="other").totals.measured_gpu_hours == 0.0


def test_a_gpu_busy_for_part_of_a_minute_is_idle_for_its_share_of_samples_below_the_threshold(
        tmp_path: Path, db_url: str) -> None:
    # Minute 3, after the first progress report: GPU 0 busy for 4 of its 12 samples and idle for 8 (a mean
    # of 30 %, above the 10 % threshold: busy by the mean alone); GPU 1 from an agent that did not count
    # (mean 3 %: idle whole, as before).
    store, market = _setup(tmp_path, db_url)
    with store.transaction() as s:
        s.add(ProgressRow(job_id="j", attempt=1, step=1, total=100, at=_at(2)))
        s.add_all([GpuMinuteRow(job_id="j", attempt=1, cluster_id="c1", node="0", gpu=gpu, uuid=f"GPU-{gpu}",
                                started_at=_at(3), ended_at=_at(4), samples=12, idle_samples=idle, seconds=60.0,
                                utilization_mean=mean, utilization_max=95.0, received_at=_at(4))
                   for gpu, idle, mean in ((0, 8, 30.0), (1, None, 3.0))])
        row = s.get(ClusterRow, "c1")
        assert row is not None
        meter_cluster(s, row, _at(9), market)
    assert attribute(store, 0.10, _at(9)) == 2
    minute = {r.holder: (r.usage, round(r.gpus, 9), round(r.cost, 9)) for r in _ledger(store) if r.minute == _at(3)}
    idle_gpus = 8 / 12 + 1.0
    assert minute == {"job:j": ("running", round(2 - idle_gpus, 9), round(PRICE / 60 * (2 - idle_gpus) / 2, 9)),
                      "held_idle:j": ("held_idle_stalled", round(idle_gpus, 9), round(PRICE / 60 * idle_gpus / 2, 9))}


def test_a_late_cluster_end_takes_the_split_back_and_it_is_made_again(tmp_path: Path) -> None:
    store, market = _setup(tmp_path, f"sqlite:///{tmp_path / 'store.db'}")
    with store.transaction() as s:
        row = s.get(ClusterRow, "c1")
        assert row is not None
        row.terminated_at = None  # its end not known yet: metered as live
        meter_cluster(s, row, _at(8), market)
    _report_minutes(store, range(0, 7))
    attribute(store, 0.10, _at(9))
    before = sorted((r.minute, r.holder, r.usage, round(r.gpus, 9)) for r in _ledger(store))
    with store.transaction() as s:
        row = s.get(ClusterRow, "c1")
        assert row is not None
        row.terminated_at = _at(6.5)  # it was gone at 6:30
        meter_cluster(s, row, _at(9), market)
    attribute(store, 0.10, _at(9))
    after = sorted((r.minute, r.holder, r.usage, round(r.gpus, 9)) for r in _ledger(store))
    assert [x for x in after if x[0] < _at(6)] == [x for x in before if x[0] < _at(6)]
    assert (_at(6), "held_idle:j", "held_idle_stalled", 2.0) in after  # minute 6 split again after re-metering
    assert not [x for x in after if x[0] >= _at(7)]


def test_an_ended_job_is_settled_once_its_cluster_is_metered_to_its_end_and_its_gpu_minutes_split(
        tmp_path: Path, db_url: str) -> None:
    """What `broker launch` steps on for after its job ended: the minutes its agent sent on exit split."""
    store, market = _setup(tmp_path, db_url)
    assert not settled(store, ["j"])  # torn down at 8:00, metered to nothing yet
    _report_minutes(store, range(0, 7))
    with store.transaction() as s:
        row = s.get(ClusterRow, "c1")
        assert row is not None
        meter_cluster(s, row, _at(9), market)
    assert not settled(store, ["j"])  # metered, the GPU minutes not split yet
    attribute(store, 0.10, _at(9))
    assert settled(store, ["j"]) and settled(store, ["other"])
    with store.transaction() as s:
        row = s.get(ClusterRow, "c1")
        assert row is not None
        row.state = "TERMINATING"  # a teardown the cloud has not confirmed
    assert not settled(store, ["j"])
