"""The local cloud: a market replayed from a trace, aligned to an accelerated clock.

Tick 0 of the trace is the clock's origin, so the replay starts when the local world is created.
Past the trace's end the last tick holds. Spot capacity, prices and preemptions all come from
the trace: a gang of n nodes in a zone is preempted at the first tick where fewer than n nodes
are available there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from providers.base import OfferKey, SpotQuote
from providers.trace import MarketTrace

# AWS gives two minutes between the interruption notice and the stop; the local cloud does too.
NOTICE_SECONDS = 120.0


class LocalMarket:
    def __init__(self, trace: MarketTrace, origin: datetime) -> None:
        self.trace = trace
        self.origin = origin
        self._zone_index = {z.key: i for i, z in enumerate(trace.zones)}

    @property
    def tick_seconds(self) -> float:
        return self.trace.tick_seconds

    def past(self, accelerator: str, gpus_per_node: int) -> MarketTrace:
        return self.trace.select(accelerator, gpus_per_node)

    def recent(self, offers: Sequence[OfferKey], now: datetime) -> None:
        """A replayed market's past is ``past``, whole."""
        return None

    def tick_at(self, when: datetime) -> int:
        offset = (when - self.origin).total_seconds() / self.trace.tick_seconds
        return max(0, min(self.trace.num_ticks - 1, int(offset)))

    def time_of(self, tick: int) -> datetime:
        return self.origin + timedelta(seconds=tick * self.trace.tick_seconds)

    def tick_start(self, when: datetime) -> datetime:
        return self.time_of(self.tick_at(when))

    def quotes(self, when: datetime) -> list[SpotQuote]:
        return [replace(q, observed_at=when) for q in self.trace.quotes_at(self.tick_at(when))]

    def quote(self, key: OfferKey, when: datetime) -> SpotQuote:
        index = self._zone_index[key]
        tick = self.tick_at(when)
        zone = self.trace.zones[index]
        return SpotQuote(
            cloud=zone.cloud, region=zone.region, zone=zone.zone, instance_type=zone.instance_type,
            accelerator=zone.accelerator, gpus_per_node=zone.gpus_per_node,
            spot_price=float(self.trace.spot_price[tick, index]),
            on_demand_price=float(self.trace.on_demand_price[tick, index]),
            observed_at=when, available_nodes=int(self.trace.available_nodes[tick, index]),
            **self.trace.signals_at(tick, index),
        )

    def available(self, key: OfferKey, when: datetime) -> int:
        return int(self.trace.available_nodes[self.tick_at(when), self._zone_index[key]])

    def preemption_time(self, key: OfferKey, nodes: int, since: datetime) -> datetime | None:
        """The start of the first tick after ``since`` where fewer than ``nodes`` are available."""
        index = self._zone_index[key]
        column = self.trace.available_nodes[:, index]
        first = self.tick_at(since) + 1
        short = (column[first:] < nodes).nonzero()[0]
        if short.size == 0:
            return None
        return self.time_of(first + int(short[0]))
