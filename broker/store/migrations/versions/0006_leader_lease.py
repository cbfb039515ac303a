"""serve: the leader lease, and the epoch each engine write carries

Revision ID: 0005_leader_lease
Revises: 0002_engine_reasons
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0005_leader_lease"
down_revision: str | None = "0002_engine_reasons"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STAMPED = ("jobs", "job_events", "clusters", "allocations", "notices", "ledger")


def upgrade() -> None:
    utc = broker.store.tables.UtcDateTime(timezone=True)
    lease = op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("expires_at", utc, nullable=False),
        sa.Column("acquired_at", utc, nullable=True),
        sa.Column("renewed_at", utc, nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    # The one row every takeover compares and sets: nobody holds it, and it expired long ago.
    op.bulk_insert(lease, [{"name": "engine", "holder": None, "epoch": 0,
                            "expires_at": datetime(1970, 1, 1, tzinfo=UTC)}])
    for table in STAMPED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("epoch", sa.Integer(), nullable=True))


def downgrade() -> None:
    for table in reversed(STAMPED):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("epoch")
    op.drop_table("leader_lease")
