"""gpu minutes: what each GPU a job held did, per minute, as its node agent measured it, and its hourly roll-up

Revision ID: 0014_gpu_minutes
Revises: 0013_rollup_seconds
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0015_gpu_minutes"
down_revision: str | None = "0014_checkpoint_save_seconds"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FIGURES = ("utilization_mean", "utilization_max", "memory_utilization_mean", "memory_utilization_max",
            "memory_used_mb_mean", "memory_used_mb_max", "memory_total_mb", "power_w_mean", "power_w_max",
            "job_utilization_mean", "job_utilization_max", "job_memory_mb_mean", "job_memory_mb_max")


def upgrade() -> None:
    when = broker.store.tables.UtcDateTime(timezone=True)
    op.create_table(
        "gpu_minutes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=100), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=96), nullable=False),
        sa.Column("started_at", when, nullable=False),
        sa.Column("ended_at", when, nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=True) for name in _FIGURES),
        sa.Column("received_at", when, nullable=False),
        sa.Column("attributed_at", when, nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "attempt", "node", "gpu", "started_at", name="uq_gpu_minute"),
    )
    op.create_index("ix_gpu_minutes_job_started", "gpu_minutes", ["job_id", "started_at"], unique=False)
    op.create_index("ix_gpu_minutes_unattributed", "gpu_minutes", ["attributed_at"], unique=False)
    op.create_index("ix_gpu_minutes_started", "gpu_minutes", ["started_at"], unique=False)
    op.create_table(
        "gpu_rollup",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("node", sa.String(length=100), nullable=False),
        sa.Column("hour", when, nullable=False),
        sa.Column("gpu_minutes", sa.Integer(), nullable=False),
        sa.Column("measured_seconds", sa.Float(), nullable=False),
        sa.Column("utilization_seconds", sa.Float(), nullable=False),
        sa.Column("peak_memory_mb", sa.Float(), nullable=True),
        sa.Column("memory_total_mb", sa.Float(), nullable=True),
        sa.Column("peak_utilization", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "node", "hour", name="uq_gpu_rollup"),
    )
    op.create_index("ix_gpu_rollup_hour", "gpu_rollup", ["hour"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_gpu_rollup_hour", table_name="gpu_rollup")
    op.drop_table("gpu_rollup")
    op.drop_index("ix_gpu_minutes_started", table_name="gpu_minutes")
    op.drop_index("ix_gpu_minutes_unattributed", table_name="gpu_minutes")
    op.drop_index("ix_gpu_minutes_job_started", table_name="gpu_minutes")
    op.drop_table("gpu_minutes")
