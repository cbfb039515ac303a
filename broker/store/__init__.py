"""The state store: SQLAlchemy 2 tables, Alembic migrations, and one transaction per engine step.

``Store`` and ``open_store`` are loaded on first use, so ``broker.status.readonly`` (what ``broker
status`` reads an embedded store with) and ``broker.store.revision`` import no SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.store.db import Store, open_store

__all__ = ["Store", "open_store"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from broker.store import db

        return getattr(db, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
