"""pipelines: the stages of a multi-document job file, and the stage each one waits for

Revision ID: 0008_pipelines
Revises: 0007_agent_reports
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_pipelines"
down_revision: str | None = "0007_agent_reports"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pipeline_id", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("stage", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("after_job_id", sa.String(length=32), nullable=True))
        batch.create_index(batch.f("ix_jobs_pipeline_id"), ["pipeline_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(batch.f("ix_jobs_pipeline_id"))
        batch.drop_column("after_job_id")
        batch.drop_column("stage")
        batch.drop_column("pipeline_id")
