"""``GET /v1/reports``: the cost report of the caller's team, when the report builder is present.

The builder (``broker.reports``) is optional in this build: without it the route answers 404
saying so, rather than an empty report that would read as "nothing was spent".
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, status

from broker.spec import SpecError, parse_duration
from broker.store import Store

REPORTS_MISSING = "reports are not available: this broker was built without its report builder (broker.reports)"


def reports_available() -> bool:
    try:
        return importlib.util.find_spec("broker.reports.build") is not None
    except ModuleNotFoundError:
        return False


def reports_router(store: Store, team_of: Any) -> APIRouter:
    router = APIRouter(tags=["reports"])

    @router.get("/v1/reports", responses={404: {"description": "the report builder is not part of this build"}})
    def report(team: str = Depends(team_of),
               since: Annotated[str, Query(description="window length before now, e.g. 7d")] = "7d") -> Any:
        """Spend, savings and idle time of the caller's team over the window (the `broker report` JSON)."""
        if not reports_available():
            raise HTTPException(status.HTTP_404_NOT_FOUND, REPORTS_MISSING)
        try:
            window_length = parse_duration(since, "since")
        except SpecError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"since: {exc.detail}") from None
        build = importlib.import_module("broker.reports.build")
        render = importlib.import_module("broker.reports.render")
        now = datetime.now(UTC)
        built = build.build_report(store, build.Window(now - window_length, now), team=team, now=now)
        return json.loads(render.render_json(built))

    return router
