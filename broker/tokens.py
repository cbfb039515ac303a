"""API tokens for teams, and the agent-token key every replica shares, both kept in the store.

An API token is shown once, at creation; the store keeps only its SHA-256 (a token is 32 random
bytes, so a plain hash is as good as a slow one). The agent-token key is the HMAC key per-cluster
agent tokens are derived from: kept in the store, so every replica derives and checks the same.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from broker.model import TEAM_PATTERN
from broker.store import Store
from broker.store.tables import ApiTokenRow, BrokerSecretRow

TOKEN_PREFIX = "bkr_"
AGENT_KEY = "agent_token_key"
# Seconds an API replica takes a token it found valid without asking the store again: a token revoked
# or expired by another process (``broker token revoke``) is refused within this; through this process
# (``revoke_api_token``, ``extend_api_token`` on the same store), at once.
TOKEN_CHECK_S = 5.0
MAX_CHECKED = 10_000  # valid tokens remembered per store; past that the memory starts again


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token_id: str
    team: str
    token: str  # the secret: printed once, never stored


def create_api_token(store: Store, team: str, expires_in: timedelta | None = None) -> IssuedToken:
    """A new token for ``team``; with ``expires_in`` it is refused, like a revoked one, from then on."""
    if not TEAM_PATTERN.match(team):
        raise ValueError(f"--team: expected letters, digits, '.', '_' or '-' (1-100 characters), got {team!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = f"tok-{secrets.token_hex(4)}"
    now = datetime.now(UTC)
    with store.transaction() as s:
        s.add(ApiTokenRow(id=token_id, team=team, token_hash=token_digest(token), created_at=now,
                          expires_at=now + expires_in if expires_in is not None else None))
    return IssuedToken(token_id, team, token)


def extend_api_token(store: Store, token_id: str, expires_in: timedelta) -> None:
    """Move an expiring token's end to ``expires_in`` from now (``broker dashboard`` keeps its own alive
    this way while it runs, so a dashboard killed with SIGKILL leaves its token valid minutes at most)."""
    with store.transaction() as s:
        row = s.get(ApiTokenRow, token_id)
        if row is not None and row.revoked_at is None:
            row.expires_at = datetime.now(UTC) + expires_in
    _forget_checked(store)


def team_of_token(store: Store, token: str) -> str | None:
    """The team a valid token belongs to: neither revoked nor expired."""
    found = _valid_token(store, token_digest(token), datetime.now(UTC))
    return found[0] if found is not None else None


def _valid_token(store: Store, digest: str, now: datetime) -> tuple[str, datetime | None] | None:
    """(team, end) of the valid token with this digest at ``now``."""
    with store.transaction() as s:
        row = s.execute(select(ApiTokenRow.team, ApiTokenRow.revoked_at, ApiTokenRow.expires_at)
                        .where(ApiTokenRow.token_hash == digest)).first()
    if row is None or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= now:
        return None
    return row.team, row.expires_at


_CHECKED: weakref.WeakKeyDictionary[object, dict[str, tuple[str, float]]] = weakref.WeakKeyDictionary()
_CHECKED_LOCK = threading.Lock()


def _checked(store: Store) -> dict[str, tuple[str, float]]:
    """The store's (its engine's) valid tokens: digest -> (team, monotonic time until which it is taken)."""
    with _CHECKED_LOCK:
        found = _CHECKED.get(store.engine)
        if found is None:
            found = _CHECKED[store.engine] = {}
        return found


def _forget_checked(store: Store) -> None:
    _checked(store).clear()


def checked_team_of_token(store: Store, token: str, within_s: float = TOKEN_CHECK_S,
                          monotonic: Callable[[], float] = time.monotonic,
                          wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> str | None:
    """``team_of_token``, asking the store at most once per ``within_s`` seconds for a token found valid
    (never past the token's end); an unknown, revoked or expired token is asked about every time."""
    digest = token_digest(token)
    checked = _checked(store)
    at = monotonic()
    hit = checked.get(digest)
    if hit is not None and at < hit[1]:
        return hit[0]
    now = wall()
    found = _valid_token(store, digest, now)
    if found is None:
        checked.pop(digest, None)
        return None
    team, ends = found
    until = at + within_s
    if ends is not None:
        until = min(until, at + (ends - now).total_seconds())
    if len(checked) >= MAX_CHECKED:
        checked.clear()
    checked[digest] = (team, until)
    return team


def list_api_tokens(store: Store) -> list[ApiTokenRow]:
    with store.transaction() as s:
        return list(s.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at)))


def revoke_api_token(store: Store, token_id: str) -> bool:
    with store.transaction() as s:
        row = s.get(ApiTokenRow, token_id)
        if row is None:
            return False
        row.revoked_at = row.revoked_at or datetime.now(UTC)
    _forget_checked(store)
    return True


def shared_secret(store: Store, name: str, make: str) -> str:
    """The stored secret ``name``; the first caller's ``make`` wins when several race to create it."""
    with store.transaction() as s:
        row = s.get(BrokerSecretRow, name)
        if row is not None:
            return row.value
    try:
        with store.transaction() as s:
            s.add(BrokerSecretRow(name=name, value=make, created_at=datetime.now(UTC)))
        return make
    except IntegrityError:
        with store.transaction() as s:
            row = s.get(BrokerSecretRow, name)
            assert row is not None
            return row.value


class SharedAgentTokens:
    """Per-cluster agent tokens: HMAC-SHA256 of the cluster id under a key kept in the store.

    A key file left in the broker home by an older embedded broker seeds the stored key, so the
    agents of clusters it started keep their tokens.
    """

    def __init__(self, store: Store, home: Path | None = None) -> None:
        seed = None
        if home is not None and (home / "agent.key").exists():
            seed = (home / "agent.key").read_text().strip()
        self._key = bytes.fromhex(shared_secret(store, AGENT_KEY, seed or secrets.token_hex(32)))

    def __call__(self, cluster_id: str) -> str:
        return hmac.new(self._key, cluster_id.encode(), hashlib.sha256).hexdigest()
