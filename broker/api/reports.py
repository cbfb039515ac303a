"""``GET /v1/reports``: the cost report of the caller's team (the same JSON as ``broker report --format json``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, status

from broker.reports.build import Window, build_report
from broker.reports.render import render_json
from broker.spec import SpecError, parse_duration
from broker.store import Store


def reports_router(store: Store, team_of: Any) -> APIRouter:
    router = APIRouter(tags=["reports"])

    @router.get("/v1/reports")
    def report(team: str = Depends(team_of),
               since: Annotated[str, Query(description="window length before now, e.g. 7d")] = "7d") -> Any:
        """Spend, savings and idle time of the caller's team over the window."""
        try:
            window_length = parse_duration(since, "since")
        except SpecError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"since: {exc.detail}") from None
        now = datetime.now(UTC)
        return json.loads(render_json(build_report(store, Window(now - window_length, now), team=team, now=now)))

    return router
