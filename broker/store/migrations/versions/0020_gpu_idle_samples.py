"""gpu idle samples: how many of a GPU-minute's samples were below the broker's idle threshold

A nullable column: minutes stored before it, and reporters that do not count, keep NULL (the
minute is then judged idle or busy by its mean, as before).

Revision ID: 0020_gpu_idle_samples
Revises: 0019_list_indexes
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_gpu_idle_samples"
down_revision: str | None = "0019_list_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_minutes") as batch:
        batch.add_column(sa.Column("idle_samples", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_minutes") as batch:
        batch.drop_column("idle_samples")
