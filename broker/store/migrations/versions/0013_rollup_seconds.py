"""roll-up seconds: the roll-up sums its rows' seconds; its row count is named pieces, not minutes

A ledger minute splits into pieces (rows) where the holders of a cluster's GPUs change, so the
count of rows was not a count of minutes. The triggers are replaced and the roll-up recomputed
from the ledger.

Revision ID: 0013_rollup_seconds
Revises: 0012_early_setup
"""

from collections.abc import Sequence

from alembic import op

from broker.store.rollup import install_sql, uninstall_sql

revision: str = "0013_rollup_seconds"
down_revision: str | None = "0012_early_setup"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    bind = op.get_bind()
    for statement in uninstall_sql(bind.dialect.name):
        bind.exec_driver_sql(statement)
    bind.exec_driver_sql("DELETE FROM ledger_rollup")
    bind.exec_driver_sql("ALTER TABLE ledger_rollup RENAME COLUMN minutes TO pieces")
    bind.exec_driver_sql("ALTER TABLE ledger_rollup ADD COLUMN seconds FLOAT DEFAULT 0 NOT NULL")
    for statement in install_sql(bind.dialect.name):  # refills it from the ledger, then the triggers
        bind.exec_driver_sql(statement)  # not text(): the SQL holds ':00' literals, no parameters


def downgrade() -> None:
    bind = op.get_bind()
    for statement in uninstall_sql(bind.dialect.name):
        bind.exec_driver_sql(statement)
    bind.exec_driver_sql("ALTER TABLE ledger_rollup DROP COLUMN seconds")
    bind.exec_driver_sql("ALTER TABLE ledger_rollup RENAME COLUMN pieces TO minutes")
    for statement in install_sql(bind.dialect.name, legacy=True, fill=False):  # the row counts stay right
        bind.exec_driver_sql(statement)
