"""Tables of the state store. Changing one means adding an Alembic migration beside it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

# Re-exported: migrations name broker.store.tables.UtcDateTime, and every table module imports Base here.
from broker.store.base import Base as Base
from broker.store.base import UtcDateTime as UtcDateTime


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    team: Mapped[str] = mapped_column(String(100), default="default", index=True)
    state: Mapped[str] = mapped_column(String(20), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=500)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the validated job file, as data
    spec_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    backend: Mapped[str] = mapped_column(String(20), default="local")
    num_nodes: Mapped[int] = mapped_column(Integer, default=1)
    gpus_per_node: Mapped[int] = mapped_column(Integer, default=0)
    accelerator: Mapped[str | None] = mapped_column(String(50), nullable=True)
    deadline: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    work_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    checkpoint_dir: Mapped[str] = mapped_column(Text)
    checkpoint: Mapped[str | None] = mapped_column(Text, nullable=True)  # latest completed
    checkpoint_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Where the job goes next: a cluster (launched for it, or a shared one) and the GPUs it claims.
    target_cluster_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    target_gpus: Mapped[dict[str, list[int]] | None] = mapped_column(JSON, nullable=True)
    # The share of each of those GPUs the job holds (A100:0.5 -> 0.5); None: whole GPUs.
    gpu_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Set while a higher-priority gang is taking this job's GPUs inside a cluster.
    preempted_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    checkpoint_requested_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # Why the job is CHECKPOINTING (broker.model.CheckpointReason); None in every other state.
    checkpoint_reason: Mapped[str | None] = mapped_column(String(20), nullable=True)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    migrations: Mapped[int] = mapped_column(Integer, default=0)
    work_lost_s: Mapped[float] = mapped_column(Float, default=0.0)
    zones: Mapped[list[str]] = mapped_column(JSON, default=list)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    wall_started_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    wall_finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the leader epoch that last wrote it
    # A stage of a pipeline (a multi-document job file): its id, the stage's place (1-based), and,
    # in a chain, the stage that must succeed before this one may start.
    pipeline_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    stage: Mapped[int | None] = mapped_column(Integer, nullable=True)
    after_job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)

    # The lists' orders (``GET /v1/jobs`` and its cursor, by team and by team and state) and the
    # finished jobs of a name and team whose predictions a summary scores.
    __table_args__ = (Index("ix_jobs_team_created", "team", "created_at", "id"),
                      Index("ix_jobs_team_state_created", "team", "state", "created_at", "id"),
                      Index("ix_jobs_name_team_finished", "name", "team", "finished_at"))


class JobEventRow(Base):
    """Every state transition and notable event of a job, in order."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime)
    kind: Mapped[str] = mapped_column(String(40))
    from_state: Mapped[str | None] = mapped_column(String(20), nullable=True)
    to_state: Mapped[str | None] = mapped_column(String(20), nullable=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the leader epoch that last wrote it


class ClusterRow(Base):
    __tablename__ = "clusters"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The same launch asked twice (engine re-run after a crash) maps to the same row.
    launch_key: Mapped[str] = mapped_column(String(128), unique=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), nullable=True, index=True)
    backend: Mapped[str] = mapped_column(String(20))
    cloud: Mapped[str] = mapped_column(String(20))
    region: Mapped[str] = mapped_column(String(64))
    zone: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    accelerator: Mapped[str | None] = mapped_column(String(50), nullable=True)
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    num_nodes: Mapped[int] = mapped_column(Integer)
    spot: Mapped[bool] = mapped_column(default=True)
    price_per_node_hour: Mapped[float] = mapped_column(Float)
    on_demand_price_per_node_hour: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(20), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Why the cluster is going or went away (broker.model.TeardownReason); None while it is wanted.
    teardown_reason: Mapped[str | None] = mapped_column(String(20), nullable=True)
    token_hash: Mapped[str | None] = mapped_column(String(128), nullable=True)
    handle: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # backend-specific
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    up_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    terminate_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    terminated_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    metered_until: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the leader epoch that last wrote it

    __table_args__ = (Index("ix_clusters_job_created", "job_id", "created_at", "id"),)  # GET /v1/clusters


class AllocationRow(Base):
    """A gang placement: which GPUs of which cluster a job held, and when."""

    __tablename__ = "allocations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[dict[str, list[int]]] = mapped_column(JSON)
    gpu_share: Mapped[float | None] = mapped_column(Float, nullable=True)  # of each GPU; None: whole GPUs
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)
    running_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # When the gang was told to checkpoint before losing these GPUs (a notice, or a preemptor).
    stopping_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(20), nullable=True)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the leader epoch that last wrote it

    __table_args__ = (UniqueConstraint("job_id", "attempt", name="uq_allocation_attempt"),)


class NoticeRow(Base):
    __tablename__ = "notices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dedup_key: Mapped[str] = mapped_column(String(200), unique=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    node: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(20))
    source: Mapped[str] = mapped_column(String(20))
    action_time: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime)
    checkpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    handled_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the leader epoch that last wrote it


class CheckpointReportRow(Base):
    """A complete checkpoint a node agent reported: the broker decides from these, never from its disk.

    ``path`` is relative to the job's checkpoint directory, so a bucket checkpoint reported from one
    cluster names the same object on the next.
    """

    __tablename__ = "checkpoint_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"))
    node: Mapped[str] = mapped_column(String(100))
    path: Mapped[str] = mapped_column(String(1024))
    step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    written_at: Mapped[datetime] = mapped_column(UtcDateTime)  # market clock
    received_at: Mapped[datetime] = mapped_column(UtcDateTime)
    save_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)  # wall seconds, as the job measured

    __table_args__ = (UniqueConstraint("job_id", "path", name="uq_checkpoint_report_path"),)


class ProgressRow(Base):
    """How far a job had got at a moment, as its agent reported (rank 0 speaks for the gang)."""

    __tablename__ = "progress_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(BigInteger)
    total: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime)  # market clock

    __table_args__ = (Index("ix_progress_reports_job_at", "job_id", "at"),)


class PredictionRow(Base):
    """A finish time the engine predicted for a running job, kept to tell later how far off it was."""

    __tablename__ = "predictions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    made_at: Mapped[datetime] = mapped_column(UtcDateTime)  # market clock
    finish_at: Mapped[datetime] = mapped_column(UtcDateTime)
    low_at: Mapped[datetime] = mapped_column(UtcDateTime)
    high_at: Mapped[datetime] = mapped_column(UtcDateTime)
    source: Mapped[str] = mapped_column(String(20))  # progress | work | history

    __table_args__ = (Index("ix_predictions_job_made", "job_id", "made_at"),)


class EarlySetupRow(Base):
    """A job's ``setup`` run ahead of its start, on GPUs it reserved (eager allocation); open until used or stopped."""

    __tablename__ = "early_setups"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    cluster_id: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)  # the attempt it readies
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)  # market clock
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True, index=True)
    outcome: Mapped[str | None] = mapped_column(String(20), nullable=True)  # used | failed | stopped


class LedgerRow(Base):
    """One minute (or a piece of one) of one cluster's GPUs held by one job or idle for one cause.

    A minute of a cluster splits into pieces where who holds its GPUs changes, and each piece into
    rows by holder (``job:<id>`` or ``idle:<cause>``), each priced by its share of the cluster's
    GPUs at the minute's quote; the unique key makes re-metering a no-op.
    """

    __tablename__ = "ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    minute: Mapped[datetime] = mapped_column(UtcDateTime, index=True)  # where the piece starts
    holder: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    team: Mapped[str | None] = mapped_column(String(100), nullable=True)
    usage: Mapped[str] = mapped_column(String(20))
    cloud: Mapped[str] = mapped_column(String(20))
    region: Mapped[str] = mapped_column(String(64))
    zone: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    accelerator: Mapped[str | None] = mapped_column(String(50), nullable=True)
    nodes: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[float] = mapped_column(Float)  # GPUs of the cluster this row covers
    # The seconds billed: the piece of the minute this row covers (less than 60 at a cluster's first and
    # last minute and where holders change), plus, on an ended cluster's last piece, what the clouds'
    # one-minute minimum adds to a cluster that lived less than a minute.
    seconds: Mapped[float] = mapped_column(Float, default=60.0, server_default="60")
    spot: Mapped[bool] = mapped_column()
    price_per_node_hour: Mapped[float] = mapped_column(Float)
    on_demand_price_per_node_hour: Mapped[float] = mapped_column(Float)
    cost: Mapped[float] = mapped_column(Float)
    on_demand_cost: Mapped[float] = mapped_column(Float)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the leader epoch that last wrote it

    __table_args__ = (
        UniqueConstraint("cluster_id", "minute", "holder", name="uq_ledger_minute"),
        Index("ix_ledger_job_minute", "job_id", "minute"),
    )


class PriceQuoteRow(Base):
    """The price book: one row per run of unchanged quotes for an offer (cloud, zone, instance type).

    A poll that finds the same prices only moves ``confirmed_at`` forward; a change, or a stale mark,
    starts a new row: the history is every change, ``[observed_at, confirmed_at]`` when it was said.
    """

    __tablename__ = "price_quotes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cloud: Mapped[str] = mapped_column(String(20))
    region: Mapped[str] = mapped_column(String(64))
    zone: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    accelerator: Mapped[str] = mapped_column(String(50))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    gpu_memory_gb: Mapped[float | None] = mapped_column(Float, nullable=True)
    spot_price: Mapped[float | None] = mapped_column(Float, nullable=True)
    on_demand_price: Mapped[float | None] = mapped_column(Float, nullable=True)
    capacity_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    obtainability: Mapped[float | None] = mapped_column(Float, nullable=True)
    estimated_uptime_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    placement_level: Mapped[str | None] = mapped_column(String(16), nullable=True)
    preemption_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    available_nodes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stale: Mapped[bool] = mapped_column(default=False)
    observed_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    confirmed_at: Mapped[datetime] = mapped_column(UtcDateTime)

    __table_args__ = (
        Index("ix_price_quotes_offer_time", "cloud", "zone", "instance_type", "observed_at"),
    )


# --- serve: API tokens, secrets every replica shares, active policy overrides ---

class ApiTokenRow(Base):
    """A team's API token; only its SHA-256 is kept (the token itself is printed once)."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(String(100), index=True)
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)  # None: never


class BrokerSecretRow(Base):
    """A secret every replica must share, created once by whichever replica needs it first."""

    __tablename__ = "broker_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class PolicyOverrideRow(Base):
    """A policy value set by a time-based schedule (``queue_priority:<queue>``, ``capacity_share:<queue>``)."""

    __tablename__ = "policy_overrides"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    schedule: Mapped[str] = mapped_column(String(100))
    fire_time: Mapped[datetime] = mapped_column(UtcDateTime)  # the schedule fire that set it
    applied_at: Mapped[datetime] = mapped_column(UtcDateTime)


# --- leadership (broker serve) ---


class LeaderLeaseRow(Base):
    """Who runs the engine, until when, and under which epoch (one more on every takeover).

    Every write of a leader's engine checks this row in its own transaction (``Store.fenced``), so a
    leader that lost the lease cannot commit anything, however late it wakes up.
    """

    __tablename__ = "leader_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(200), nullable=True)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    acquired_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    renewed_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
