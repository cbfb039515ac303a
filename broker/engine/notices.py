"""Termination notices as the engine reads them: recorded once, whichever source heard first.

An agent's report (through the API), a cloud's event stream and the backend's own status can
all announce the same notice; ``broker.notices.record`` writes it once.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.clock import Clock
from broker.notices.record import Notice, record_notice
from broker.store import Store
from broker.store.tables import NoticeRow

# The notice kinds that take a cluster's nodes away (a rebalance recommendation does not).
TERMINATE_KINDS = ("terminate", "stop", "hibernate", "maintenance")


def record_backend_notice(store: Store, clock: Clock, cluster_id: str, action_at: datetime) -> None:
    """A notice the backend saw (``action_at`` on the broker's clock), unless an agent's report came first."""
    record_notice(store, clock, Notice(cluster_id, "terminate", action_time=action_at), source="backend")


def open_notice(s: Session, cluster_id: str, any_state: bool = False) -> NoticeRow | None:
    """The cluster's termination notice not yet acted on (``any_state``: acted on or not)."""
    query = select(NoticeRow).where(NoticeRow.cluster_id == cluster_id, NoticeRow.kind.in_(TERMINATE_KINDS))
    if not any_state:
        query = query.where(NoticeRow.handled_at.is_(None))
    return s.scalar(query)


def notices_of(s: Session, cluster_id: str) -> list[NoticeRow]:
    return list(s.scalars(select(NoticeRow).where(NoticeRow.cluster_id == cluster_id)))
