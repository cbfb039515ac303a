"""``POST /v1/gpu``: what a job's GPUs did, per minute, as the node agent measured them through NVML.

One request per node and interval carries that interval's minutes (at most ``MAX_MINUTES``). The
token is checked before the body is read and is good only for its own cluster; the job must have
run there in the attempt named; every figure is a finite number in its range (a mean never above
its peak); each minute must lie within a day of now and inside the attempt's allocation. Anything
else is refused whole with one line naming the field, and nothing is stored. A minute sent twice
is stored once.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, status
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.api.auth import agent_dependency
from broker.api.validation import body_schema, json_body, sane_datetime
from broker.clock import Clock
from broker.store import Store
from broker.store.gpu import FIGURES, GpuMinuteRow, GpuRollupRow
from broker.store.tables import AllocationRow

MAX_MINUTES = 512  # 8 GPUs for an hour, with room
WALL_SKEW_SECONDS = 24 * 3600.0
# A minute may end a little after the allocation (the agent's last report follows the job's exit).
ALLOCATION_SLACK = timedelta(minutes=2)

Percent = Annotated[float | None, Field(default=None, ge=0, le=100, allow_inf_nan=False)]
Megabytes = Annotated[float | None, Field(default=None, ge=0, le=16 * 2**20, allow_inf_nan=False)]  # 16 TB
Watts = Annotated[float | None, Field(default=None, ge=0, le=100_000, allow_inf_nan=False)]


class GpuMinute(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: int = Field(ge=0, le=1023)
    uuid: str = Field(default="", max_length=96, pattern=r"^[A-Za-z0-9_.:-]*$")
    minute: datetime
    samples: int = Field(ge=1, le=100_000)
    idle_samples: int | None = Field(default=None, ge=0, le=100_000)  # of them, below the idle threshold
    memory_total_mb: Megabytes = None
    utilization_mean: Percent = None
    utilization_max: Percent = None
    memory_utilization_mean: Percent = None
    memory_utilization_max: Percent = None
    memory_used_mb_mean: Megabytes = None
    memory_used_mb_max: Megabytes = None
    power_w_mean: Watts = None
    power_w_max: Watts = None
    job_utilization_mean: Percent = None
    job_utilization_max: Percent = None
    job_memory_mb_mean: Megabytes = None
    job_memory_mb_max: Megabytes = None

    @model_validator(mode="after")
    def _consistent(self) -> GpuMinute:
        sane_datetime(self.minute)
        if self.idle_samples is not None and self.idle_samples > self.samples:
            raise ValueError("idle_samples: more than samples")
        for name in FIGURES:
            mean, peak = getattr(self, f"{name}_mean"), getattr(self, f"{name}_max")
            if mean is not None and peak is not None and mean > peak + 1e-6:
                raise ValueError(f"{name}_mean: above {name}_max")
        used, total = self.memory_used_mb_max, self.memory_total_mb
        if used is not None and total is not None and used > total + 1.0:
            raise ValueError("memory_used_mb_max: above memory_total_mb")
        return self


class GpuReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")
    attempt: int = Field(ge=0, le=1_000_000)
    cluster_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    node: str = Field(default="0", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    minutes: list[GpuMinute] = Field(min_length=1, max_length=MAX_MINUTES)


class GpuAccepted(BaseModel):
    stored: int
    duplicates: int


def gpu_reports_router(store: Store, clock: Clock) -> APIRouter:
    router = APIRouter()
    agent = agent_dependency(store)

    @router.post("/v1/gpu", status_code=status.HTTP_202_ACCEPTED, response_model=GpuAccepted,
                 openapi_extra=body_schema(GpuReport))
    def post_gpu(*, owner: str = Depends(agent),
                 report: Annotated[GpuReport, Depends(json_body(GpuReport))]) -> GpuAccepted:
        if owner != report.cluster_id:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "cluster_id: this token may only report for its own cluster")
        spans: list[tuple[GpuMinute, datetime, datetime]] = []
        for i, minute in enumerate(report.minutes):
            wall = minute.minute.astimezone(UTC).replace(second=0, microsecond=0).timestamp()
            if abs(wall - time.time()) > WALL_SKEW_SECONDS:
                raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                    f"minutes.{i}.minute: more than a day from now")
            spans.append((minute, clock.to_clock(wall), clock.to_clock(wall + 60.0)))
        with store.transaction() as s:
            alloc = s.scalar(select(AllocationRow).where(
                AllocationRow.job_id == report.job_id, AllocationRow.attempt == report.attempt,
                AllocationRow.cluster_id == report.cluster_id))
            if alloc is None:
                raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                    "job_id: that job did not run here in that attempt")
            for i, (_, start, end) in enumerate(spans):
                if end < alloc.started_at or (alloc.ended_at is not None and start > alloc.ended_at + ALLOCATION_SLACK):
                    raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                        f"minutes.{i}.minute: outside the job's run on this cluster")
            stored_before = s.execute(select(GpuMinuteRow.gpu, GpuMinuteRow.started_at).where(
                GpuMinuteRow.job_id == report.job_id, GpuMinuteRow.attempt == report.attempt,
                GpuMinuteRow.node == report.node, GpuMinuteRow.started_at.in_([start for _, start, _ in spans])))
            known: set[tuple[int, datetime]] = {(int(gpu), at) for gpu, at in stored_before}
            received, new = clock.now(), []
            for minute, start, end in spans:
                if (minute.gpu, start) in known:
                    continue
                known.add((minute.gpu, start))
                figures = minute.model_dump(exclude={"gpu", "uuid", "minute", "samples"})
                held_to = min(end, received, alloc.ended_at or end)
                seconds = max((held_to - max(start, alloc.started_at)).total_seconds(), 0.0)
                new.append(GpuMinuteRow(job_id=report.job_id, attempt=report.attempt, cluster_id=report.cluster_id,
                                        node=report.node, gpu=minute.gpu, uuid=minute.uuid, started_at=start,
                                        ended_at=end, samples=minute.samples, seconds=seconds, received_at=received,
                                        **figures))
            s.add_all(new)
            add_to_rollup(s, report.job_id, report.node, new)
        return GpuAccepted(stored=len(new), duplicates=len(spans) - len(new))

    return router


def add_to_rollup(s: Session, job_id: str, node: str, minutes: list[GpuMinuteRow]) -> None:
    """Add stored minutes to their hours of the job's roll-up (one node's report: one writer per row)."""
    by_hour: dict[datetime, list[GpuMinuteRow]] = {}
    for m in minutes:
        by_hour.setdefault(m.started_at.replace(minute=0, second=0, microsecond=0), []).append(m)
    for hour, rows in by_hour.items():
        row = s.scalar(select(GpuRollupRow).where(GpuRollupRow.job_id == job_id, GpuRollupRow.node == node,
                                                   GpuRollupRow.hour == hour))
        if row is None:
            row = GpuRollupRow(job_id=job_id, node=node, hour=hour, gpu_minutes=0, measured_seconds=0.0,
                               utilization_seconds=0.0)
            s.add(row)
        for m in rows:
            seconds = m.seconds
            util = m.job_utilization_mean if m.job_utilization_mean is not None else m.utilization_mean
            util_peak = m.job_utilization_max if m.job_utilization_max is not None else m.utilization_max
            memory = m.job_memory_mb_max if m.job_memory_mb_max is not None else m.memory_used_mb_max
            row.gpu_minutes += 1
            if util is not None:
                row.measured_seconds += seconds
                row.utilization_seconds += util * seconds
            row.peak_memory_mb = _peak(row.peak_memory_mb, memory)
            row.peak_utilization = _peak(row.peak_utilization, util_peak)
            row.memory_total_mb = _peak(row.memory_total_mb, m.memory_total_mb)


def _peak(old: float | None, new: float | None) -> float | None:
    return new if old is None else old if new is None else max(old, new)
