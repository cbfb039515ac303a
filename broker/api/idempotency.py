"""``Idempotency-Key`` on ``POST /v1/jobs`` and ``/v1/pipelines``: a client that timed out and sends the
same submission again with the same key gets the jobs the first one stored, never two copies.

The key belongs to the token's team. It is stored with the jobs in their own transaction (so two
retries racing each other store one job: the second's insert of the key fails and it answers with
the first's jobs), with the request's digest: the same key sent with another job file is refused,
since answering with the first one's job would hide the mistake. Keys are kept a day.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import HTTPException, Request, status
from sqlalchemy import delete
from sqlalchemy.orm import Session

from broker.store import Store
from broker.store.submissions import IdempotencyKeyRow

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_CHARS = 255
KEPT = timedelta(days=1)


def idempotency_key(request: Request) -> str | None:
    """The request's key, None without one; a 400 naming the header for a key that is not one."""
    values = request.headers.getlist(HEADER)
    if not values:
        return None
    if len(values) > 1:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"{HEADER}: send it once, got {len(values)} of them")
    key = values[0]
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all("\x21" <= c <= "\x7e" for c in key):
        raise HTTPException(status.HTTP_400_BAD_REQUEST,
                            f"{HEADER}: expected 1-{MAX_KEY_CHARS} printable ASCII characters without spaces "
                            f"(a UUID will do), got {len(key)} characters")
    return key


def request_digest(route: str, spec: str, source: str | None) -> str:
    return hashlib.sha256(json.dumps([route, spec, source]).encode("utf-8", "surrogatepass")).hexdigest()


def earlier(store: Store, team: str, key: str, route: str, digest: str) -> dict[str, Any] | None:
    """What a request of ``team`` with ``key`` stored within the last day (``job_ids``, and a pipeline's
    ``name`` and ``kind``); None if none did.
    A 422 naming the header when that request was another one. Keys older than a day go first."""
    with store.transaction() as s:
        s.execute(delete(IdempotencyKeyRow).where(IdempotencyKeyRow.created_at < datetime.now(UTC) - KEPT))
        row = s.get(IdempotencyKeyRow, (team, key))
        if row is None:
            return None
        if row.route != route or row.digest != digest:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                f"{HEADER}: already used within the last day for a different submission; send "
                                "a new key with each new job file")
        return dict(row.answer)


def remember(team: str, key: str, route: str, digest: str,
             **extra: str) -> Callable[[Session, list[str]], None]:
    """What stores the key in the jobs' own transaction (``broker.intake.submit``'s ``within``)."""
    def add(s: Session, job_ids: list[str]) -> None:
        s.add(IdempotencyKeyRow(team=team, key=key, route=route, digest=digest,
                                answer={"job_ids": job_ids, **extra}, created_at=datetime.now(UTC)))
        s.flush()

    return add
