"""A store holding every kind of job `broker status` shows, written through the real ORM and migrations:
what the status read paths (SQLAlchemy's and sqlite3's) are compared over."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from broker.model import JobState
from broker.store import open_store
from broker.store.gpu import GpuRollupRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow, PredictionRow, ProgressRow

T0 = datetime(2026, 3, 1, 9, 0, 0, tzinfo=UTC)  # whole seconds: stored without microseconds' digits mattering
NOW = T0 + timedelta(hours=3, seconds=12.345678)


def _cluster(s: Any, cluster_id: str, job_id: str | None, *, up: bool = True, spot: bool = True,
             teardown: str | None = None, created: datetime = T0, nodes: int = 1) -> None:
    s.add(ClusterRow(id=cluster_id, launch_key=f"key-{cluster_id}", job_id=job_id, backend="local", cloud="aws",
                     region="us-east-1", zone=f"us-east-1{cluster_id[-1]}", instance_type="p3.8xlarge",
                     accelerator="V100", gpus_per_node=4, num_nodes=nodes, spot=spot,
                     price_per_node_hour=3.6712345 if spot else 12.24, on_demand_price_per_node_hour=12.24,
                     state="TERMINATED" if teardown else "UP", teardown_reason=teardown, handle={"pid": 1},
                     created_at=created, up_at=created + timedelta(seconds=30) if up else None))


def _job(s: Any, job_id: str, state: str, *, name: str = "train", team: str = "ml", at: datetime = T0,
         **columns: Any) -> None:
    finished = at + timedelta(minutes=50, microseconds=250_000) if JobState(state).terminal else None
    values: dict[str, Any] = {
        "id": job_id, "name": name, "team": team, "state": state, "spec": {"name": name}, "checkpoint_dir": "/ck",
        "num_nodes": 1, "gpus_per_node": 4, "zones": [], "attempt": 1, "created_at": at, "updated_at": at,
        "started_at": at, "finished_at": finished, "wall_started_at": at + timedelta(seconds=1.5),
        "wall_finished_at": finished and finished + timedelta(seconds=3)}
    s.add(JobRow(**{**values, **columns}))
    s.flush()


def _allocation(s: Any, job_id: str, cluster_id: str, attempt: int, at: datetime, running: bool = True) -> None:
    s.add(AllocationRow(job_id=job_id, cluster_id=cluster_id, attempt=attempt, gpus={"0": [0, 1]}, started_at=at,
                        running_at=at + timedelta(seconds=7, microseconds=1) if running else None))


def _ledger(s: Any, cluster_id: str, job_id: str, minutes: int, price: float) -> None:
    for m in range(minutes):
        s.add(LedgerRow(cluster_id=cluster_id, minute=T0 + timedelta(minutes=m), holder=f"job:{job_id}",
                        job_id=job_id, team="ml", usage="job", cloud="aws", region="us-east-1", zone="us-east-1a",
                        instance_type="p3.8xlarge", accelerator="V100", nodes=1, gpus=2.0,
                        seconds=60.0 if m else 17.5, spot=True, price_per_node_hour=price,
                        on_demand_price_per_node_hour=12.24, cost=price / 60 / 3, on_demand_cost=12.24 / 60 / 3))


def _predict(s: Any, job_id: str, made: datetime, finish: datetime, source: str = "progress") -> None:
    s.add(PredictionRow(job_id=job_id, attempt=1, made_at=made, finish_at=finish,
                        low_at=finish - timedelta(seconds=90), high_at=finish + timedelta(seconds=125), source=source))


def store_with_every_kind_of_job(url: str, many: int = 0) -> list[str]:
    """Jobs in every state, a migrated one, a pipeline's stages, half-GPU shares on one pool cluster,
    progress and predictions, earlier finished jobs of the same name, and ``many`` more of one name."""
    store = open_store(url)
    ids: list[str] = []
    with store.transaction() as s:
        _cluster(s, "c-a", None)
        _cluster(s, "c-b", None, spot=False, teardown="finished", created=T0 + timedelta(minutes=5), nodes=2)
        _cluster(s, "c-c", None, up=False)
        for n, state in enumerate(JobState):
            job_id = f"j-{state.value.lower()}"
            extra: dict[str, Any] = {}
            if state is JobState.CHECKPOINTING:
                extra = {"checkpoint_reason": "notice", "checkpoint": "step-00100"}
            if state is JobState.FAILED:
                extra = {"exit_code": 3, "reason": "exit 3: [red]not markup[/red] ünïcode ✓"}
            if state is JobState.PENDING:
                extra = {"reason": "waiting for V100:4 (no zone has 1 node free)", "wall_started_at": None,
                         "deadline": T0 + timedelta(hours=3)}
            _job(s, job_id, state.value, at=T0 + timedelta(seconds=n), **extra)
            ids.append(job_id)
        # The migrated job: its first cluster preempted, the second (launched for it) up.
        job = s.get(JobRow, "j-migrating")
        assert job is not None
        job.preemptions, job.migrations, job.attempt = 1, 1, 2
        job.zones, job.work_lost_s = ["us-east-1a", "us-east-1b"], 123.456
        for job_id in ("j-running", "j-checkpointing", "j-succeeded", "j-failed", "j-cancelled", "j-migrating"):
            _allocation(s, job_id, "c-a", 1, T0)
            _ledger(s, "c-a", job_id, 7, 3.6712345)
        _allocation(s, "j-migrating", "c-b", 2, T0 + timedelta(minutes=9), running=False)
        s.flush()
        s.get(ClusterRow, "c-c").job_id = "j-provisioning"  # type: ignore[union-attr]  # launched, not up
        s.get(ClusterRow, "c-b").job_id = "j-migrating"  # type: ignore[union-attr]
        # Progress (with a total, without one) and predictions (the latest wins; ties by id).
        for step in (10, 50, 80, 81):  # 80 and 81 reported at the same moment: the later row wins
            s.add(ProgressRow(job_id="j-running", attempt=1, step=step, total=400,
                              at=T0 + timedelta(seconds=min(step, 80))))
        s.add(ProgressRow(job_id="j-checkpointing", attempt=1, step=7, total=None, at=T0))
        # What its GPUs did: 2 GPU-hours measured at 30 % on one node, 1 at 60 % on the other (40 % in all).
        for node, hours, util, peak in (("0", 2.0, 30.0, 30000.0), ("1", 1.0, 60.0, 41000.5)):
            s.add(GpuRollupRow(job_id="j-running", node=node, hour=T0, gpu_minutes=int(hours * 60),
                               measured_seconds=hours * 3600, utilization_seconds=util * hours * 3600,
                               peak_memory_mb=peak, memory_total_mb=81920.0, peak_utilization=util + 10))
        _predict(s, "j-running", T0 + timedelta(minutes=2), T0 + timedelta(minutes=40))
        _predict(s, "j-running", T0 + timedelta(minutes=3), T0 + timedelta(minutes=39), "history")
        _predict(s, "j-running", T0 + timedelta(minutes=3), T0 + timedelta(minutes=41, microseconds=5), "work")
        # Earlier finished jobs of the same name and team, predictions off by different amounts.
        for k in range(4):
            done = f"j-earlier-{k}"
            _job(s, done, "SUCCEEDED", at=T0 - timedelta(days=1, minutes=k))
            finished = T0 - timedelta(days=1, minutes=k) + timedelta(minutes=50, microseconds=250_000)
            for p in range(k + 1):
                _predict(s, done, finished - timedelta(minutes=30 - p), finished + timedelta(seconds=17 * (k - p)))
            ids.append(done)
        _predict(s, "j-succeeded", T0 + timedelta(minutes=10), T0 + timedelta(minutes=49))
        # A chain pipeline's two stages, and two half-GPU jobs sharing the pool cluster c-a.
        _job(s, "j-stage1", "SUCCEEDED", name="prep", at=T0 + timedelta(minutes=1), pipeline_id="p-1", stage=1)
        _job(s, "j-stage2", "RUNNING", name="fit", at=T0 + timedelta(minutes=1), pipeline_id="p-1", stage=2,
             after_job_id="j-stage1")
        for half in ("j-half-1", "j-half-2"):
            _job(s, half, "RUNNING", name="half", team="ops", at=T0 + timedelta(minutes=2), gpu_share=0.5)
            _allocation(s, half, "c-a", 1, T0 + timedelta(minutes=2))
        ids += ["j-stage1", "j-stage2", "j-half-1", "j-half-2"]
        for k in range(many):
            job_id = f"j-many-{k:04d}"
            _job(s, job_id, ("SUCCEEDED", "RUNNING", "PENDING")[k % 3], name="sweep",
                 at=T0 + timedelta(minutes=3, seconds=k // 2))  # pairs submitted at the same second
            if k % 3 == 0:
                _predict(s, job_id, T0, T0 + timedelta(minutes=50, seconds=k))
            ids.append(job_id)
    store.dispose()
    return ids
