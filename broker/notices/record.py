"""The one writer of termination notices: once per ``<cluster>:<kind>``, whoever heard it first.

A node's agent (through ``POST /v1/notices``), EventBridge (through the SQS listener) and the
backend's own status can all announce the same notice; the store's unique ``dedup_key`` keeps one
row, and a later report of it may only add a newer checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from broker.clock import Clock
from broker.store import Store
from broker.store.tables import NoticeRow

KINDS = ("terminate", "stop", "hibernate", "rebalance", "maintenance")
# The lengths of the columns the values are stored in.
MAX_CLUSTER_ID = 64
MAX_NODE = 100
MAX_CHECKPOINT = 4096
# Times outside these years are refused: they cannot be meant, and arithmetic on them overflows.
EARLIEST_YEAR = 1970
LATEST_YEAR = 2200


def dedup_key(cluster_id: str, kind: str) -> str:
    return f"{cluster_id}:{kind}"


@dataclass(frozen=True)
class Notice:
    """A notice as heard (``to_clock`` puts a reporter's real time on the broker's clock)."""

    cluster_id: str
    kind: str
    node: str = "*"  # the node that heard it; "*" for the whole cluster (the backend's status)
    action_time: datetime | None = None  # when the cloud takes the node, on the broker's clock
    checkpoint: str | None = None
    # What the reporter said beyond that (noticed_at, signaled_at, and checkpoint_at: when the node saved
    # ``checkpoint``), kept as it came.
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """What the store's columns cannot hold is refused here, naming the field (a ValueError)."""
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind[:40]!r}")
        for name, value, longest in (("cluster_id", self.cluster_id, MAX_CLUSTER_ID), ("node", self.node, MAX_NODE),
                                     ("checkpoint", self.checkpoint or "", MAX_CHECKPOINT)):
            if len(value) > longest:
                raise ValueError(f"{name}: at most {longest} characters, got {len(value)}")
            if "\x00" in value:
                raise ValueError(f"{name}: contains a NUL byte")
        if not self.cluster_id:
            raise ValueError("cluster_id: empty")


@dataclass(frozen=True)
class Recorded:
    notice_id: int
    duplicate: bool  # the notice was known already


def within_years(name: str, value: datetime | None) -> datetime | None:
    """``value`` (UTC when it names no zone) if it lies between EARLIEST_YEAR and LATEST_YEAR; else a ValueError."""
    if value is None:
        return None
    if not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
        raise ValueError(f"{name}: expected a time between {EARLIEST_YEAR} and {LATEST_YEAR}, got year {value.year}")
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def to_clock(clock: Clock, value: datetime | None, strict: bool = False) -> datetime | None:
    """A real time on the broker's clock; None when the clock cannot hold it (``strict``: the error)."""
    if value is None:
        return None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        return clock.to_clock(value.timestamp())
    except (OverflowError, ValueError):
        if strict:
            raise
        return None  # beyond what the clock can express: no deadline the engine could plan on


def record_notice(store: Store, clock: Clock, notice: Notice, source: str) -> Recorded:
    """Record ``notice`` unless it is known; a known one only takes a checkpoint newer than its own."""
    key = dedup_key(notice.cluster_id, notice.kind)
    with store.transaction() as s:
        known = s.scalar(select(NoticeRow.id).where(NoticeRow.dedup_key == key))
    if known is not None and notice.checkpoint is None:
        return Recorded(known, duplicate=True)  # nothing to add
    if known is None:
        try:
            with store.transaction() as s:
                row = NoticeRow(dedup_key=key, cluster_id=notice.cluster_id, node=notice.node, kind=notice.kind,
                                source=source, action_time=notice.action_time,
                                received_at=clock.now(), checkpoint=notice.checkpoint, detail=dict(notice.detail))
                s.add(row)
                s.flush()
                return Recorded(row.id, duplicate=False)
        except IntegrityError:
            pass  # another reporter got there first: the same notice, recorded once
    with store.transaction() as s:
        existing = s.scalar(select(NoticeRow).where(NoticeRow.dedup_key == key).with_for_update())
        assert existing is not None
        reported_at = notice.detail.get("checkpoint_at")
        newer = reported_at is not None and (
            existing.detail.get("checkpoint_at") is None or str(reported_at) > str(existing.detail["checkpoint_at"]))
        if notice.checkpoint and existing.checkpoint != notice.checkpoint and newer:
            existing.checkpoint = notice.checkpoint
            existing.detail = {**(existing.detail or {}), "checkpoint_at": reported_at}
        return Recorded(existing.id, duplicate=True)
