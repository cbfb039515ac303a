"""preemption rate: GCP's advice.capacityHistory daily Spot preemption rate, on each quote

A nullable column: quotes recorded before it, and clouds that give no such signal, keep NULL.

Revision ID: 0017_preemption_rate
Revises: 0016_capacity_signals
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_preemption_rate"
down_revision: str | None = "0016_capacity_signals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("price_quotes") as batch:
        batch.add_column(sa.Column("preemption_rate", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("price_quotes") as batch:
        batch.drop_column("preemption_rate")
