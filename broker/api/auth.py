"""Bearer-token authentication of team API calls: the team a token belongs to, or 401."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Header, HTTPException, status

from broker.store import Store
from broker.tokens import team_of_token


def bearer_token(authorization: Annotated[str | None, Header()] = None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token: send `Authorization: Bearer <token>`",
                            headers={"WWW-Authenticate": "Bearer"})
    return authorization.split(" ", 1)[1].strip()


def team_dependency(store: Store) -> Callable[[str | None], str]:
    def team(authorization: Annotated[str | None, Header()] = None) -> str:
        found = team_of_token(store, bearer_token(authorization))
        if found is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown or revoked token",
                                headers={"WWW-Authenticate": "Bearer"})
        return found

    return team
