"""Idempotency keys of job submissions: a retried ``POST /v1/jobs`` or ``/v1/pipelines`` with the same
``Idempotency-Key`` gets the jobs the first one stored, never a second copy.

A key is its team's (two teams may use the same key), written in the transaction that stores the
jobs, so either both are stored or neither; the request's digest tells a retry from another job
file sent with a key already used. Kept a day (on the wall clock: clients retry in wall time).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from broker.store.tables import Base, UtcDateTime


class IdempotencyKeyRow(Base):
    __tablename__ = "idempotency_keys"

    team: Mapped[str] = mapped_column(String(100), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    route: Mapped[str] = mapped_column(String(16))  # jobs or pipelines
    digest: Mapped[str] = mapped_column(String(64))  # SHA-256 of the request's body
    answer: Mapped[dict[str, Any]] = mapped_column(JSON)  # job_ids, and a pipeline's name and kind
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
