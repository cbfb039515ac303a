"""engine: why a job is checkpointing, why a cluster is going away

Revision ID: 0002_engine_reasons
Revises: 0002_tokens
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_engine_reasons"
down_revision: str | None = "0002_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("checkpoint_reason", sa.String(length=20), nullable=True))
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("teardown_reason", sa.String(length=20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("teardown_reason")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("checkpoint_reason")
