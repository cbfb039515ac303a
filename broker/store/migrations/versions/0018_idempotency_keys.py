"""idempotency keys of job submissions; API tokens that expire

``idempotency_keys``: one row per (team, key) of a keyed ``POST /v1/jobs`` or ``/v1/pipelines``,
with the job ids it stored (and a pipeline's name and kind). ``api_tokens.expires_at``: NULL for
tokens that never expire (every token made before this revision).

Revision ID: 0018_idempotency_keys
Revises: 0017_preemption_rate
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from broker.store.tables import UtcDateTime

revision: str = "0018_idempotency_keys"
down_revision: str | None = "0017_preemption_rate"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("team", sa.String(100), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("route", sa.String(16), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("answer", sa.JSON(), nullable=False),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_idempotency_keys_created_at", "idempotency_keys", ["created_at"])
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("expires_at", UtcDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("expires_at")
    op.drop_index("ix_idempotency_keys_created_at", "idempotency_keys")
    op.drop_table("idempotency_keys")
