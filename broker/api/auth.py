"""Bearer-token authentication: team API calls (the team a token belongs to) and node agents (their
cluster, while it lives), or 401 before anything else about the request is looked at."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Header, HTTPException, status
from sqlalchemy import select

from broker.model import ClusterState
from broker.store import Store
from broker.store.tables import ClusterRow
from broker.tokens import checked_team_of_token, token_digest

# Our tokens are well under this; a longer header is refused before it is hashed or looked up.
MAX_TOKEN_CHARS = 512


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})


def bearer_token(authorization: Annotated[str | None, Header()] = None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise _unauthorized("missing bearer token: send `Authorization: Bearer <token>`")
    token = authorization.split(" ", 1)[1].strip()
    if not token or len(token) > MAX_TOKEN_CHARS or "\x00" in token:
        raise _unauthorized("unknown or revoked token")
    return token


def team_dependency(store: Store) -> Callable[[str | None], str]:
    """The team of the bearer token; a token found valid is taken for ``broker.tokens.TOKEN_CHECK_S``
    without asking the store again (a page of a list is a few milliseconds: the check was a tenth)."""
    def team(authorization: Annotated[str | None, Header()] = None) -> str:
        found = checked_team_of_token(store, bearer_token(authorization))
        if found is None:
            raise _unauthorized("unknown or revoked token")
        return found

    return team


def agent_dependency(store: Store) -> Callable[[str | None], str]:
    """The cluster whose agent token is presented; 401 for an unknown token or a cluster that ended
    (an agent token dies with its cluster, so a leaked one is worth nothing afterwards)."""
    def cluster(authorization: Annotated[str | None, Header()] = None) -> str:
        digest = token_digest(bearer_token(authorization))
        with store.transaction() as s:
            found = s.execute(select(ClusterRow.id, ClusterRow.state).where(ClusterRow.token_hash == digest)).first()
        if found is None:
            raise _unauthorized("unknown token")
        if not ClusterState(found.state).live:
            raise _unauthorized(f"the token's cluster is {found.state.lower()}: its agent token has expired")
        return str(found.id)

    return cluster
