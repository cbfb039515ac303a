"""agent reports: complete checkpoints and progress the node agents report

Revision ID: 0007_agent_reports
Revises: 0005_leader_lease
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0007_agent_reports"
down_revision: str | None = "0005_leader_lease"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_reports",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("cluster_id", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=100), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("written_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("received_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "path", name="uq_checkpoint_report_path"),
    )
    op.create_index(op.f("ix_checkpoint_reports_job_id"), "checkpoint_reports", ["job_id"], unique=False)
    op.create_table(
        "progress_reports",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=True),
        sa.Column("at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_progress_reports_job_at", "progress_reports", ["job_id", "at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_progress_reports_job_at", table_name="progress_reports")
    op.drop_table("progress_reports")
    op.drop_index(op.f("ix_checkpoint_reports_job_id"), table_name="checkpoint_reports")
    op.drop_table("checkpoint_reports")
