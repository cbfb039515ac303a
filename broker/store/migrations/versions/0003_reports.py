"""report deliveries, schedule runs and budget alerts

Revision ID: 0002_reports
Revises: 0002_prices
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0002_reports"
down_revision: str | None = "0002_prices"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    utc = broker.store.tables.UtcDateTime(timezone=True)
    op.create_table(
        "report_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("channel", sa.String(length=20), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("schedule", sa.String(length=200), nullable=True),
        sa.Column("created_at", utc, nullable=False),
        sa.Column("last_attempt_at", utc, nullable=True),
        sa.Column("sent_at", utc, nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("report_deliveries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_report_deliveries_status"), ["status"], unique=False)

    op.create_table(
        "report_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("schedule", sa.String(length=200), nullable=False),
        sa.Column("fire_time", utc, nullable=False),
        sa.Column("claimed_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("schedule", "fire_time", name="uq_report_run"),
    )
    op.create_table(
        "budget_alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("team", sa.String(length=100), nullable=False),
        sa.Column("period_start", utc, nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("spend", sa.Float(), nullable=False),
        sa.Column("budget", sa.Float(), nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("team", "period_start", "threshold", name="uq_budget_alert"),
    )


def downgrade() -> None:
    op.drop_table("budget_alerts")
    op.drop_table("report_runs")
    with op.batch_alter_table("report_deliveries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_report_deliveries_status"))
    op.drop_table("report_deliveries")
