"""A polled or backfilled quote as the price book's row."""

from __future__ import annotations

from datetime import datetime

from broker.store.tables import PriceQuoteRow
from providers.base import SpotQuote


def quote_row(q: SpotQuote, observed_at: datetime, confirmed_at: datetime) -> PriceQuoteRow:
    """A quote as the book stores it: seen at ``observed_at``, still the price at ``confirmed_at``."""
    return PriceQuoteRow(
        cloud=q.cloud, region=q.region, zone=q.zone, instance_type=q.instance_type,
        accelerator=q.accelerator, gpus_per_node=q.gpus_per_node, gpu_memory_gb=q.gpu_memory_gb,
        spot_price=q.spot_price, on_demand_price=q.on_demand_price, capacity_score=q.capacity_score,
        obtainability=q.obtainability, estimated_uptime_s=q.estimated_uptime_s,
        placement_level=q.placement_level, preemption_rate=q.preemption_rate,
        available_nodes=q.available_nodes, stale=False, observed_at=observed_at, confirmed_at=confirmed_at)
