"""early setup: a job's setup run ahead of its start on the GPUs it reserved

Revision ID: 0012_early_setup
Revises: 0011_eager
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0012_early_setup"
down_revision: str | None = "0011_eager"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "early_setups",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("cluster_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("ended_at", broker.store.tables.UtcDateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_early_setups_job_id"), "early_setups", ["job_id"], unique=False)
    op.create_index(op.f("ix_early_setups_ended_at"), "early_setups", ["ended_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_early_setups_ended_at"), table_name="early_setups")
    op.drop_index(op.f("ix_early_setups_job_id"), table_name="early_setups")
    op.drop_table("early_setups")
