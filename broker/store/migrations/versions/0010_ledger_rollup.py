"""ledger roll-up: the ledger summed by UTC hour, kept equal to it by triggers

Revision ID: 0010_ledger_rollup
Revises: 0009_sharing
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.tables
from broker.store.rollup import KEYS, install_sql, uninstall_sql

revision: str = "0010_ledger_rollup"
down_revision: str | None = "0009_sharing"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ledger_rollup",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster_id", sa.String(length=64), nullable=False),
        sa.Column("hour", broker.store.tables.UtcDateTime(timezone=True), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("team", sa.String(length=100), nullable=False),
        sa.Column("usage", sa.String(length=20), nullable=False),
        sa.Column("cloud", sa.String(length=20), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("zone", sa.String(length=64), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("accelerator", sa.String(length=50), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("minutes", sa.Integer(), nullable=False),
        sa.Column("gpu_minutes", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("on_demand_cost", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(*KEYS, name="uq_ledger_rollup_key"),
    )
    op.create_index("ix_ledger_rollup_hour", "ledger_rollup", ["hour"], unique=False)
    op.create_index(op.f("ix_ledger_rollup_job_id"), "ledger_rollup", ["job_id"], unique=False)
    bind = op.get_bind()
    for statement in install_sql(bind.dialect.name, legacy=True):  # its own shape; 0013 adds seconds
        bind.exec_driver_sql(statement)  # not text(): the SQL holds ':00' literals, no parameters


def downgrade() -> None:
    bind = op.get_bind()
    for statement in uninstall_sql(bind.dialect.name):
        bind.exec_driver_sql(statement)
    op.drop_index(op.f("ix_ledger_rollup_job_id"), table_name="ledger_rollup")
    op.drop_index("ix_ledger_rollup_hour", table_name="ledger_rollup")
    op.drop_table("ledger_rollup")
