"""``GET /v1/prices``: the latest quote of every offer in the price book, cheapest per GPU first."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from broker.market.book import PriceBook, QuoteFilter
from broker.store import Store


def latest_prices(store: Store, cloud: str | None = None, accelerator: str | None = None) -> list[dict[str, Any]]:
    where = QuoteFilter(clouds=(cloud,) if cloud else None, accelerator=accelerator)
    quotes = PriceBook(store).latest(where)
    quotes.sort(key=lambda q: ((q.spot_price if q.spot_price is not None else float("inf")) / max(q.gpus_per_node, 1),
                               q.cloud, q.zone, q.instance_type))
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in asdict(q).items()} for q in quotes]


def prices_router(store: Store, team_of: Any) -> APIRouter:
    router = APIRouter(tags=["prices"])

    @router.get("/v1/prices")
    def prices(team: str = Depends(team_of),
               cloud: Annotated[str | None, Query(description="aws, gcp or azure")] = None,
               accelerator: Annotated[str | None, Query(description="e.g. A100")] = None) -> list[dict[str, Any]]:
        """Latest spot and on-demand quote per offer (cloud, zone, instance type), USD per node-hour."""
        return latest_prices(store, cloud, accelerator)

    return router
