"""eager: the finish times the engine predicted, kept to measure how far off they were

Revision ID: 0011_eager
Revises: 0010_ledger_rollup
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0011_eager"
down_revision: str | None = "0010_ledger_rollup"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "predictions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("made_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("finish_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("low_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("high_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=20), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_predictions_job_made", "predictions", ["job_id", "made_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_predictions_job_made", table_name="predictions")
    op.drop_table("predictions")
