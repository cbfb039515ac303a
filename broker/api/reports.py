"""``GET /v1/reports``: the cost report of the caller's team (the same JSON as ``broker report --format json``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, status

from broker.reports.build import Window, build_report
from broker.reports.render import render_json
from broker.spec.job import SpecError, parse_duration
from broker.store import Store

# Reports reach back at most this far (the ledger cannot be older than the broker).
MAX_WINDOW = timedelta(days=36500)


def reports_router(store: Store, team_of: Any) -> APIRouter:
    router = APIRouter(tags=["reports"])

    @router.get("/v1/reports")
    def report(team: str = Depends(team_of),
               since: Annotated[str, Query(description="window length before now, e.g. 7d", max_length=40)] = "7d",
               ) -> Any:
        """Spend, savings and idle time of the caller's team over the window."""
        try:
            window_length = parse_duration(since, "since")
        except SpecError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"since: {exc.detail}") from None
        except OverflowError:
            window_length = MAX_WINDOW + MAX_WINDOW
        if window_length > MAX_WINDOW:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                f"since: at most {MAX_WINDOW.days} days, got {since!r}")
        now = datetime.now(UTC)
        return json.loads(render_json(build_report(store, Window(now - window_length, now), team=team, now=now)))

    return router
