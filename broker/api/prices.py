"""``GET /v1/prices``: the latest quote of every offer in the store's price book.

The price book table (``price_quotes``) is written by the price pollers; a store without it (an
older schema, or a broker that never polled) answers an empty list. The table is reflected, not
imported, so this route does not depend on the poller's code being present.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from sqlalchemy import MetaData, Table, and_, func, inspect, select

from broker.store import Store

PRICE_TABLE = "price_quotes"
FIELDS = ("cloud", "region", "zone", "instance_type", "accelerator", "gpus_per_node", "spot_price",
          "on_demand_price", "capacity_score", "available_nodes", "stale", "observed_at", "confirmed_at")


def _price_table(store: Store) -> Table | None:
    if not inspect(store.engine).has_table(PRICE_TABLE):
        return None
    return Table(PRICE_TABLE, MetaData(), autoload_with=store.engine)


def latest_prices(store: Store, cloud: str | None = None, accelerator: str | None = None) -> list[dict[str, Any]]:
    table = _price_table(store)
    if table is None:
        return []
    c = table.c
    latest = (select(c.cloud, c.zone, c.instance_type, func.max(c.observed_at).label("at"))
              .group_by(c.cloud, c.zone, c.instance_type).subquery())
    query = select(table).join(latest, and_(c.cloud == latest.c.cloud, c.zone == latest.c.zone,
                                            c.instance_type == latest.c.instance_type, c.observed_at == latest.c.at))
    if cloud:
        query = query.where(c.cloud == cloud)
    if accelerator:
        query = query.where(func.lower(c.accelerator) == accelerator.lower())
    query = query.order_by(c.accelerator, c.gpus_per_node, c.spot_price)
    with store.engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items() if k in FIELDS}
            for row in rows]


def prices_router(store: Store, team_of: Any) -> APIRouter:
    router = APIRouter(tags=["prices"])

    @router.get("/v1/prices")
    def prices(team: str = Depends(team_of),
               cloud: Annotated[str | None, Query(description="aws, gcp or azure")] = None,
               accelerator: Annotated[str | None, Query(description="e.g. A100")] = None) -> list[dict[str, Any]]:
        """Latest spot and on-demand quote per offer (cloud, zone, instance type), USD per node-hour."""
        return latest_prices(store, cloud, accelerator)

    return router
