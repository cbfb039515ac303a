"""API tokens for teams, and the agent-token key every replica shares, both kept in the store.

An API token is shown once, at creation; the store keeps only its SHA-256 (a token is 32 random
bytes, so a plain hash is as good as a slow one). The agent-token key is the HMAC key per-cluster
agent tokens are derived from: kept in the store, so every replica derives and checks the same.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
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


def team_of_token(store: Store, token: str) -> str | None:
    """The team a valid token belongs to: neither revoked nor expired."""
    with store.transaction() as s:
        row = s.scalar(select(ApiTokenRow).where(ApiTokenRow.token_hash == token_digest(token)))
    if row is None or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= datetime.now(UTC):
        return None
    return row.team


def list_api_tokens(store: Store) -> list[ApiTokenRow]:
    with store.transaction() as s:
        return list(s.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at)))


def revoke_api_token(store: Store, token_id: str) -> bool:
    with store.transaction() as s:
        row = s.get(ApiTokenRow, token_id)
        if row is None:
            return False
        row.revoked_at = row.revoked_at or datetime.now(UTC)
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
