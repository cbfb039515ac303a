"""capacity signals: GCP obtainability and estimated uptime, Azure placement level, on each quote

Nullable columns: quotes recorded before them, and clouds that give no such signal, keep NULL.

Revision ID: 0014_capacity_signals
Revises: 0013_rollup_seconds
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_capacity_signals"
down_revision: str | None = "0015_gpu_minutes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (("obtainability", sa.Float()), ("estimated_uptime_s", sa.Float()), ("placement_level", sa.String(16)))


def upgrade() -> None:
    with op.batch_alter_table("price_quotes") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("price_quotes") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
