"""checkpoint save seconds: how long the job itself measured its checkpoint's save to take

Revision ID: 0014_checkpoint_save_seconds
Revises: 0013_rollup_seconds
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_checkpoint_save_seconds"
down_revision: str | None = "0013_rollup_seconds"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoint_reports") as batch:
        batch.add_column(sa.Column("save_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoint_reports") as batch:
        batch.drop_column("save_seconds")
