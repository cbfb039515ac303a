"""What the GPUs did: one row per job attempt, node, GPU and minute, as the node agent measured it.

The agent aggregates its NVML samples per wall-clock minute; the API stores each minute here with
its start and end on the broker's clock (the market clock, which may run faster than the wall),
so the ledger's minutes can be matched to what their GPUs did. ``None`` in a figure: the GPU
does not give it. Kept as long as the ledger is; a re-sent minute is the same row.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from broker.store.tables import Base, UtcDateTime

# The figures of a minute, each with its mean and its peak (the agent's report names them so).
FIGURES = ("utilization", "memory_utilization", "memory_used_mb", "power_w", "job_utilization", "job_memory_mb")


class GpuMinuteRow(Base):
    __tablename__ = "gpu_minutes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    cluster_id: Mapped[str] = mapped_column(String(64))
    node: Mapped[str] = mapped_column(String(100))
    gpu: Mapped[int] = mapped_column(Integer)  # the node's index of the GPU
    uuid: Mapped[str] = mapped_column(String(96), default="")
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)  # market clock
    ended_at: Mapped[datetime] = mapped_column(UtcDateTime)
    samples: Mapped[int] = mapped_column(Integer)
    # Of them, those below the broker's idle threshold (None: not counted, or no utilisation figure).
    idle_samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The seconds of the span the job held the GPU (clipped to its allocation and to when it was received).
    seconds: Mapped[float] = mapped_column(Float)
    utilization_mean: Mapped[float | None] = mapped_column(Float, nullable=True)  # percent
    utilization_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_utilization_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_utilization_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_mb_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_mb_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_total_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_w_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_w_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    # On a GPU the job shares: its own processes' figures, where the driver gives them.
    job_utilization_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    job_utilization_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    job_memory_mb_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    job_memory_mb_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # When the ledger's minutes it covers were split by what the GPU did (None: not yet).
    attributed_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)

    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "node", "gpu", "started_at", name="uq_gpu_minute"),
        Index("ix_gpu_minutes_job_started", "job_id", "started_at"),
        Index("ix_gpu_minutes_unattributed", "attributed_at"),
        Index("ix_gpu_minutes_started", "started_at"),
    )


class GpuRollupRow(Base):
    """A job's measured GPU minutes summed per node and clock hour: what status, reports and right-sizing read.

    Written by the API in the transaction that stores the minutes (each node's agent sends one report
    at a time, so one writer per row). ``measured_seconds`` counts GPU-seconds with a utilisation
    figure; ``utilization_seconds`` is their utilisation (percent) times their seconds.
    """

    __tablename__ = "gpu_rollup"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32))
    node: Mapped[str] = mapped_column(String(100))
    hour: Mapped[datetime] = mapped_column(UtcDateTime)  # market clock, the start of the hour
    gpu_minutes: Mapped[int] = mapped_column(Integer)  # GPU-minute rows summed here
    measured_seconds: Mapped[float] = mapped_column(Float)
    utilization_seconds: Mapped[float] = mapped_column(Float)
    peak_memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)  # the job's own on a shared GPU
    memory_total_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_utilization: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        UniqueConstraint("job_id", "node", "hour", name="uq_gpu_rollup"),
        Index("ix_gpu_rollup_hour", "hour"),
    )
