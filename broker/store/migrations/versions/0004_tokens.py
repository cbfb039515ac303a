"""serve: api tokens, shared secrets, policy overrides

Revision ID: 0002_tokens
Revises: 0002_reports
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables

revision: str = "0002_tokens"
down_revision: str | None = "0002_reports"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("team", sa.String(length=100), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("created_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", broker.store.tables.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index(op.f("ix_api_tokens_team"), "api_tokens", ["team"], unique=False)
    op.create_table(
        "broker_secrets",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "policy_overrides",
        sa.Column("key", sa.String(length=100), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("schedule", sa.String(length=100), nullable=False),
        sa.Column("fire_time", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("applied_at", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("policy_overrides")
    op.drop_table("broker_secrets")
    op.drop_index(op.f("ix_api_tokens_team"), table_name="api_tokens")
    op.drop_table("api_tokens")
