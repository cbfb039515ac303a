"""Opening the store: the engine, migrations to head, and one transaction per unit of work."""

from __future__ import annotations

import fcntl
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine, event, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from broker.errors import BrokerError, UserError
from broker.store.private import private_database, private_directory
from broker.store.revision import MIGRATIONS, head_revision
from broker.store.tables import LeaderLeaseRow

if TYPE_CHECKING:
    from alembic.config import Config

_migrate_lock = threading.Lock()


class StoreError(UserError, RuntimeError):
    """The store cannot be opened or migrated at the URL given: exit 2 in the CLI, 503 from the API."""

    http_status = 503


class Fenced(BrokerError, RuntimeError):
    """This process no longer holds the leader lease its work was fenced by: stop, write nothing."""


@dataclass(frozen=True)
class Fence:
    """One tenure of the leader lease: who, which epoch, and the holder's own view of it.

    ``held`` is the holder's local check (lease not released, renewed recently enough by its own
    monotonic clock); it saves a round trip and stops a process that wakes from a stall before it
    does anything. The database check in ``FencedStore.transaction`` does not rely on it.
    """

    lease: str
    holder: str
    epoch: int
    held: Callable[[], bool]
    # PostgreSQL ends a fenced transaction left idle this long (a leader stalled mid-transaction):
    # its row locks must not outlive its lease, or they would stall the next leader.
    idle_timeout_s: float = 7.5

    def ensure(self) -> None:
        if not self.held():
            raise Fenced(f"leader lease {self.lease!r} epoch {self.epoch} is no longer held by {self.holder}")


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


POOL_CONNECTIONS = 15  # a process's PostgreSQL connections at most, as before (SQLAlchemy's 5 + 10 overflow)


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:" and not path.startswith("file:"):
            parent = Path(path).parent
            if not parent.exists():
                private_directory(parent)
            private_database(Path(path))
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
    # As many connections kept as may be open at once (SQLAlchemy's default keeps 5 of 15): under 20
    # concurrent API requests, a third of them opened a connection (a new PostgreSQL backend, its
    # prepared statements gone) and closed it again after one transaction.
    return create_engine(url, pool_pre_ping=True, pool_size=POOL_CONNECTIONS, max_overflow=0)


class WriteCount:
    """How many statements that may change rows this process has sent through a store (any but a plain
    read; the leader lease's own upkeep left out): equal counts on either side of a stretch of work say
    that nothing in this process wrote to the store meanwhile."""

    READS = ("select", "pragma", "set", "show", "savepoint", "release", "rollback")

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: object, _cursor: object, statement: str, *_: object) -> None:
        words = statement.lstrip()[:16].lower().split(None, 1)
        if (not words or words[0] not in self.READS) and LeaderLeaseRow.__tablename__ not in statement:
            self.count += 1


class Store:
    """A handle on the database; ``with store.transaction() as s:`` is one atomic step."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = _make_engine(url)
        self.writes = WriteCount(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def at_head(self) -> bool:
        """Whether the database already stands at the newest migration (read without importing Alembic)."""
        head = head_revision()
        if head is None:
            return False
        try:
            with self.engine.connect() as conn:
                return bool(conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == head)
        except DBAPIError:  # no alembic_version table yet: a new store
            return False

    def migrate(self) -> None:
        # A store already at head (every command after the first) does not pay for importing Alembic.
        if self.at_head():
            return
        from alembic import command
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

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

    def fenced(self, fence: Fence) -> FencedStore:
        """A view of this store whose every transaction commits only while ``fence`` holds the lease."""
        return FencedStore(self, fence)

    def dispose(self) -> None:
        self.engine.dispose()


class FencedStore(Store):
    """The store the leader's engine writes through: every transaction carries the leader's epoch.

    Each transaction first locks the lease row in the database, and only if it still names this
    holder and epoch and has not expired (otherwise it raises ``Fenced`` and nothing is written).
    On PostgreSQL the lock is ``FOR KEY SHARE``: a takeover or a release locks the row ``FOR
    UPDATE`` first, so it waits for the transactions that passed the check to end, and a check
    that starts after it sees the new epoch (read committed re-reads a row a committed update
    changed): a stale write and the takeover cannot both commit in the wrong order. Renewals are
    plain updates, which do not wait for the engine's transactions. On SQLite the check is an
    ``UPDATE``, which takes the database's single write lock for the whole transaction. Rows
    written get the epoch in their ``epoch`` column.
    """

    def __init__(self, store: Store, fence: Fence) -> None:
        # Shares the store's pool (super().__init__ would open a second one).
        self.url = store.url
        self.engine = store.engine
        self.writes = store.writes
        self._sessions = store._sessions
        self.fence = fence

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        self.fence.ensure()
        session = self._sessions()
        try:
            with session.begin():
                self._check_lease(session)
                epoch = self.fence.epoch
                session.info[EPOCH] = epoch  # for rows written without the ORM (``epoch_of``)
                event.listen(session, "before_flush", lambda s, _ctx, _objs: _stamp(s, epoch))
                yield session
        finally:
            session.close()

    def _check_lease(self, session: Session) -> None:
        fence = self.fence
        mine = ((LeaderLeaseRow.name == fence.lease) & (LeaderLeaseRow.holder == fence.holder)
                & (LeaderLeaseRow.epoch == fence.epoch))
        if self.dialect == "postgresql":
            from sqlalchemy import func, text

            session.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {int(fence.idle_timeout_s * 1000)}"))
            # broker.epoch names the transaction's epoch to the database (for triggers, audits).
            found = session.scalar(select(func.set_config("broker.epoch", str(fence.epoch), True))
                                   .where(mine, LeaderLeaseRow.expires_at > func.now())
                                   .with_for_update(read=True, key_share=True))
        else:
            now = datetime.now(UTC)
            found = session.execute(update(LeaderLeaseRow).where(mine, LeaderLeaseRow.expires_at > now)
                                    .values(epoch=LeaderLeaseRow.epoch)).rowcount or None  # type: ignore[attr-defined]
        if not found:
            raise Fenced(f"leader lease {fence.lease!r} epoch {fence.epoch} is no longer held by {fence.holder}:"
                         " the database refused the write")


EPOCH = "broker.epoch"


def epoch_of(session: Session) -> int | None:
    """The leader epoch a fenced transaction stamps on the rows it writes (None outside a fenced store):
    for rows inserted without the ORM, which the flush's stamping does not see."""
    epoch = session.info.get(EPOCH)
    return epoch if isinstance(epoch, int) else None


def _stamp(session: Session, epoch: int) -> None:
    for obj in [*session.new, *(o for o in session.dirty if session.is_modified(o))]:
        if hasattr(obj, "epoch") and not isinstance(obj, LeaderLeaseRow):
            obj.epoch = epoch


def open_store(url: str, migrate: bool = True) -> Store:
    store = Store(url)
    try:
        if migrate:
            store.migrate()
    except Exception as exc:
        store.dispose()
        raise store_error("open", url, exc) from exc
    return store


def store_error(doing: str, url: str, exc: BaseException) -> StoreError:
    """One line saying what could not be done with the store at ``url`` (credentials left out), and why."""
    said = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return StoreError(f"cannot {doing} the store at {_redact(url)}: {said}")


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url
