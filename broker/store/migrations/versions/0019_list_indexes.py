"""indexes for the paginated lists

``jobs``: (team, created_at, id) and (team, state, created_at, id), the orders of ``GET /v1/jobs``
and of its cursor with and without a state filter; (name, team, finished_at), the finished jobs of a
name and team that a job's summary scores its predictions against. ``clusters``: (job_id,
created_at, id), the order of ``GET /v1/clusters``.

Revision ID: 0019_list_indexes
Revises: 0018_idempotency_keys
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019_list_indexes"
down_revision: str | None = "0018_idempotency_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = (("ix_jobs_team_created", "jobs", ["team", "created_at", "id"]),
           ("ix_jobs_team_state_created", "jobs", ["team", "state", "created_at", "id"]),
           ("ix_jobs_name_team_finished", "jobs", ["name", "team", "finished_at"]),
           ("ix_clusters_job_created", "clusters", ["job_id", "created_at", "id"]))


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
