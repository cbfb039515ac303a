"""price book

Revision ID: 0002_prices
Revises: 0001
Create Date: 2026-11-21 12:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0002_prices"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "price_quotes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cloud", sa.String(length=20), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("zone", sa.String(length=64), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("accelerator", sa.String(length=50), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("gpu_memory_gb", sa.Float(), nullable=True),
        sa.Column("spot_price", sa.Float(), nullable=True),
        sa.Column("on_demand_price", sa.Float(), nullable=True),
        sa.Column("capacity_score", sa.Float(), nullable=True),
        sa.Column("available_nodes", sa.Integer(), nullable=True),
        sa.Column("stale", sa.Boolean(), nullable=False),
        sa.Column("observed_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("confirmed_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("price_quotes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_price_quotes_observed_at"), ["observed_at"], unique=False)
        batch_op.create_index("ix_price_quotes_offer_time", ["cloud", "zone", "instance_type", "observed_at"],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table("price_quotes", schema=None) as batch_op:
        batch_op.drop_index("ix_price_quotes_offer_time")
        batch_op.drop_index(batch_op.f("ix_price_quotes_observed_at"))
    op.drop_table("price_quotes")
