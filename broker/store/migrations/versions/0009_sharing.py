"""GPU sharing: the share of each GPU a job holds (None: whole GPUs)

Revision ID: 0009_sharing
Revises: 0008_pipelines
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_sharing"
down_revision: str | None = "0008_pipelines"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("gpu_share", sa.Float(), nullable=True))
    op.add_column("allocations", sa.Column("gpu_share", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("gpu_share")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpu_share")
