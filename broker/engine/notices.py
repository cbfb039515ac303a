"""Termination notices as the engine reads them: recorded once, whichever source heard first.

An agent's report (through the API), a cloud's event stream and the backend's own status can
all announce the same notice; the store's unique ``dedup_key`` keeps one row per cluster.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker.clock import Clock
from broker.store import Store
from broker.store.tables import NoticeRow

# The notice kinds that take a cluster's nodes away (a rebalance recommendation does not).
TERMINATE_KINDS = ("terminate", "stop", "hibernate", "maintenance")


def record_backend_notice(store: Store, clock: Clock, cluster_id: str, action_at: datetime) -> None:
    """A notice the backend saw: recorded unless an agent's report got there first."""
    key = f"{cluster_id}:terminate"
    with store.transaction() as s:
        if s.scalar(select(NoticeRow.id).where(NoticeRow.dedup_key == key)) is not None:
            return
    try:
        with store.transaction() as s:
            s.add(NoticeRow(dedup_key=key, cluster_id=cluster_id, node="*", kind="terminate", source="backend",
                            action_time=action_at, received_at=clock.now(), detail={}))
    except IntegrityError:
        pass  # an agent's report won the race: the same notice, recorded once


def open_notice(s: Session, cluster_id: str, any_state: bool = False) -> NoticeRow | None:
    """The cluster's termination notice not yet acted on (``any_state``: acted on or not)."""
    query = select(NoticeRow).where(NoticeRow.cluster_id == cluster_id, NoticeRow.kind.in_(TERMINATE_KINDS))
    if not any_state:
        query = query.where(NoticeRow.handled_at.is_(None))
    return s.scalar(query)


def notices_of(s: Session, cluster_id: str) -> list[NoticeRow]:
    return list(s.scalars(select(NoticeRow).where(NoticeRow.cluster_id == cluster_id)))
