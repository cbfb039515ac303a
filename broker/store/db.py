"""Opening the store: the engine, migrations to head, and one transaction per unit of work."""

from __future__ import annotations

import fcntl
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"

_migrate_lock = threading.Lock()


class StoreError(RuntimeError):
    pass


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return create_engine(url, pool_pre_ping=True)


class Store:
    """A handle on the database; ``with store.transaction() as s:`` is one atomic step."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = _make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def migrate(self) -> None:
        # Alembic reports every step at INFO; a command's output is not the place for it.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        with _migrate_lock, self._file_lock(), self.engine.begin() as conn:
            config = alembic_config(self.url)
            config.attributes["connection"] = conn
            if self.dialect == "postgresql":
                # Serialise concurrent replicas migrating the same database.
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(726374)")
            current = MigrationContext.configure(conn).get_current_revision()
            head = ScriptDirectory.from_config(config).get_current_head()
            if current != head:
                command.upgrade(config, "head")

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Serialise processes migrating the same SQLite file (PostgreSQL uses an advisory lock)."""
        path = self.engine.url.database if self.dialect == "sqlite" else None
        if not path or path == ":memory:":
            yield
            return
        with open(f"{path}.migrate-lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            with session.begin():
                yield session
        finally:
            session.close()

    def dispose(self) -> None:
        self.engine.dispose()


def open_store(url: str, migrate: bool = True) -> Store:
    store = Store(url)
    try:
        if migrate:
            store.migrate()
    except Exception as exc:
        store.dispose()
        said = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise StoreError(f"cannot open the store at {_redact(url)}: {said}") from exc
    return store


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url
