"""Who is looking: an API token kept in an HttpOnly cookie, resolved to a team (or the admin) per request."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from broker.store import Store
from broker.tokens import team_of_token

COOKIE = "broker_token"
# A token made with `broker token create --team admin` sees every team's jobs in the dashboard.
ADMIN_TEAM = "admin"
MAX_TOKEN_LENGTH = 200


@dataclass(frozen=True, slots=True)
class Viewer:
    team: str

    @property
    def admin(self) -> bool:
        return self.team == ADMIN_TEAM

    @property
    def scope(self) -> str | None:
        """The team whose data this viewer may see; None: every team."""
        return None if self.admin else self.team


def viewer_of_token(store: Store, token: str) -> Viewer | None:
    if not token or len(token) > MAX_TOKEN_LENGTH or "\x00" in token:
        return None
    team = team_of_token(store, token)
    return Viewer(team) if team is not None else None


def current_viewer(store: Store, request: Request) -> Viewer | None:
    return viewer_of_token(store, request.cookies.get(COOKIE, ""))
