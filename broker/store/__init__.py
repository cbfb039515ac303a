"""The state store: SQLAlchemy 2 tables, Alembic migrations, and one transaction per engine step."""

from broker.store.db import Store, open_store

__all__ = ["Store", "open_store"]
