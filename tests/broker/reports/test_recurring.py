"""Right-sizing a recurring job from its earlier runs, worked by hand, on SQLite and PostgreSQL.

The job ``nightly`` of team ``ml`` asks for one A100 (40 GB). Its runs:

    n0  on a T4   no GPU figures; progress every minute, 12 steps  -> 5 s a step on a T4
    n1  on A100   20 % busy for an hour, peak 12 GB; 30 steps/min  -> 2 s a step on an A100
    n2  on A100   10 % busy for an hour, peak 4 GB (the report's window: 1 GPU-h at $3.00)

Alone, n2 (peak 4 GB: 4.8 / 40 = 0.12; 10 % busy: 0.1 / 0.8 = 0.125) would fit a quarter of its A100.
With n1 the peak is 12 GB (14.4 / 40 = 0.36) and it is 15 % busy over both runs
((20 + 10) / 2; 0.15 / 0.8 = 0.1875): half an A100, saving 3.00 x 0.5 = 1.50.

A T4 (16 GB) holds the 14.4 GB; the fleet paid $0.60 a GPU-hour for one in the window. Its measured
step times make a T4 5 / 2 = 2.5x as slow as an A100 for this job: 0.15 x 2.5 + 0.85 = 1.225x as
long, 1.225 x 0.60 = $0.735 instead of $3.00, saving $2.265. (The default table's 2.2 / 0.35 would
have said 1.79x and $1.08.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.reports.build import Window, build_report
from broker.reports.recurring import measured_speeds, pooled
from broker.reports.render import render_text
from broker.reports.rightsizing import job_suggestions
from broker.store import open_store
from broker.store.gpu import GpuRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, ProgressRow

T0 = datetime(2026, 2, 1, tzinfo=UTC)
DAY = timedelta(days=1)


def _run(s: Any, job_id: str, start: datetime, gpu: str, *, util: float | None = None, peak_gb: float = 0.0,
         step_s: float | None = None, cost_per_minute: float = 0.05) -> None:
    end = start + timedelta(hours=1)
    s.add(JobRow(id=job_id, name="nightly", team="ml", state="SUCCEEDED", priority=500, spec={}, backend="local",
                 num_nodes=1, gpus_per_node=1, accelerator="A100", checkpoint_dir="/c", created_at=start,
                 updated_at=end, started_at=start, finished_at=end, zones=[], attempt=1))
    s.flush()
    s.add(ClusterRow(id=f"c-{job_id}", launch_key=f"k-{job_id}", job_id=job_id, backend="local", cloud="aws",
                     region="us-east-1", zone="us-east-1a", instance_type="x", accelerator=gpu, gpus_per_node=1,
                     num_nodes=1, spot=True, price_per_node_hour=60 * cost_per_minute,
                     on_demand_price_per_node_hour=9.0, state="TERMINATED", created_at=start, up_at=start,
                     terminated_at=end, handle={}))
    s.flush()
    s.add(AllocationRow(job_id=job_id, cluster_id=f"c-{job_id}", attempt=1, gpus={"0": [0]}, started_at=start,
                        running_at=start, ended_at=end, outcome="succeeded"))
    s.add_all([LedgerRow(cluster_id=f"c-{job_id}", minute=start + timedelta(minutes=m), holder=f"job:{job_id}",
                         job_id=job_id, team="ml", usage="running", cloud="aws", region="us-east-1",
                         zone="us-east-1a", instance_type="x", accelerator=gpu, nodes=1, gpus=1.0, seconds=60.0,
                         spot=True, price_per_node_hour=60 * cost_per_minute, on_demand_price_per_node_hour=9.0,
                         cost=cost_per_minute, on_demand_cost=0.15) for m in range(60)])
    if util is not None:
        s.add(GpuRollupRow(job_id=job_id, node="0", hour=start, gpu_minutes=60, measured_seconds=3600.0,
                           utilization_seconds=util * 3600.0, peak_memory_mb=peak_gb * 1024.0,
                           memory_total_mb=40960.0, peak_utilization=util * 2))
    if step_s is not None:  # a report a minute, 60 / step_s steps apart
        s.add_all([ProgressRow(job_id=job_id, attempt=1, step=int(m * 60 / step_s), total=None,
                               at=start + timedelta(minutes=m)) for m in range(11)])


@pytest.fixture
def store(db_url: str) -> Any:
    opened = open_store(db_url)
    with opened.transaction() as s:
        _run(s, "n0", T0, "T4", step_s=5.0, cost_per_minute=0.01)
        _run(s, "n1", T0 + DAY, "A100", util=20.0, peak_gb=12.0, step_s=2.0)
        _run(s, "n2", T0 + 2 * DAY, "A100", util=10.0, peak_gb=4.0)
    yield opened
    opened.dispose()


def test_a_recurring_job_is_sized_for_every_run_seen_at_its_measured_speeds(store: Any) -> None:
    with store.transaction() as s:
        jobs = {j: s.get(JobRow, j) for j in ("n0", "n1", "n2")}
        figures = pooled(s, list(jobs.values()))
        assert set(figures) == {"n1", "n2"}  # n0 was not measured: no advice of its own
        assert (figures["n1"].runs, figures["n1"].peak_memory_mb) == (1, 12 * 1024.0)  # n2 came after it
        assert (figures["n2"].runs, figures["n2"].peak_memory_mb, figures["n2"].seconds,
                figures["n2"].utilization_seconds) == (2, 12 * 1024.0, 7200.0, 30.0 * 3600)
        assert measured_speeds(s, [jobs["n2"]]) == {("nightly", "ml"): pytest.approx({"A100": 0.5, "T4": 0.2})}

    # The window holds n0's T4 hour (what the fleet paid for a T4) and n2's A100 hour.
    window = Window(T0, T0 + 2 * DAY + timedelta(hours=1))
    report = build_report(store, window)
    by_job = {entry["job_id"]: entry for entry in report.right_sizing}
    n2 = by_job["n2"]
    assert n2["runs"] == 2
    assert [(a["kind"], a["saving"], a["slower"]) for a in n2["suggestions"]] == [
        ("cheaper_gpu", pytest.approx(3.0 - 1.225 * 0.60), pytest.approx(1.225)),
        ("fraction", pytest.approx(1.50), 1.0)]
    cheaper, fraction = (a["text"] for a in n2["suggestions"])
    assert cheaper.startswith("1x T4 (16 GB, at least 1.2x its 12.0 GB peak) at $0.60/GPU-h would have cost $0.7")
    assert cheaper.endswith("instead of $3.00, running about 1.23x as long (speeds measured from its step times on "
                            "both)")
    assert fraction == ("it would have fit 0.5 of its A100 (peak 12.0 of 40 GB, 15% busy over its last 2 runs): "
                        "ask for A100:0.5 and save $1.50")
    assert "- nightly (ml) [n2]: it would have fit 0.5 of its A100" in render_text(report)
    # n1 alone (20 % busy, peak 12 GB): max(14.4 / 40, 0.2 / 0.8) = 0.36 -> half, saving 1.50 of its 3.00.
    assert [a["kind"] for a in by_job["n1"]["suggestions"]] == ["cheaper_gpu", "fraction"]

    # The job page: the same advice over the job's whole ledger, priced at what the fleet paid that week.
    with store.transaction() as s:
        page = job_suggestions(s, s.get(JobRow, "n2"))
    assert [(a.kind, round(a.saving, 3)) for a in page] == [("cheaper_gpu", 2.265), ("fraction", 1.5)]


def test_without_step_times_on_two_types_the_default_table_says_it_is_not_measured(store: Any) -> None:
    with store.transaction() as s:
        s.query(ProgressRow).filter(ProgressRow.job_id == "n0").delete()
    with store.transaction() as s:
        assert measured_speeds(s, [s.get(JobRow, "n2")]) == {}  # A100 alone compares with nothing
    report = build_report(store, Window(T0, T0 + 2 * DAY + timedelta(hours=1)))
    (cheaper, _) = next(e for e in report.right_sizing if e["job_id"] == "n2")["suggestions"]
    slower = 0.15 * 2.2 / 0.35 + 0.85
    assert cheaper["slower"] == pytest.approx(slower, abs=1e-4)
    assert cheaper["saving"] == pytest.approx(3.0 - slower * 0.60, abs=1e-5)
    assert cheaper["text"].endswith("(speeds from the default speed table, not measured)")
