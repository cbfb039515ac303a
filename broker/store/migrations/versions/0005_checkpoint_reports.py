"""checkpoint reports: complete checkpoints the node agents report

Revision ID: 0003_checkpoint_reports
Revises: 0002_tokens
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0003_checkpoint_reports"
down_revision: str | None = "0002_tokens"
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
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("written_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("received_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "path", name="uq_checkpoint_report_path"),
    )
    op.create_index(op.f("ix_checkpoint_reports_job_id"), "checkpoint_reports", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_checkpoint_reports_job_id"), table_name="checkpoint_reports")
    op.drop_table("checkpoint_reports")
