"""A market view over SkyPilot's own catalog: the price book's fallback for offers it never quoted.

Prices are the catalog's (list on-demand, and spot as of its last refresh, per zone where the
cloud prices zones apart); capacity is unknown (``available_nodes`` None), so plans rank zones by
price alone and learn capacity from failed launches. Azure has no zones in SkyPilot: its zone is
its region. Only the accelerators the jobs ask for are read, each once, and kept.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any

from broker.market.book import LiveQuotes
from providers.base import PUBLIC_CLOUDS, OfferKey, SpotQuote


def _price(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) or number <= 0 else number


class SkyCatalogMarket(LiveQuotes):
    def __init__(self, accelerators: Callable[[], Iterable[str]], clouds: Iterable[str] = PUBLIC_CLOUDS,
                 catalog: Any = None) -> None:
        self.accelerators = accelerators  # the names wanted now (those of the active jobs)
        self.clouds = tuple(clouds)
        self._catalog = catalog
        self._read_names: set[str] = set()
        self._quotes: dict[OfferKey, SpotQuote] = {}
        self._lock = threading.Lock()

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            from sky import catalog

            self._catalog = catalog
        return self._catalog

    def _load(self, names: Iterable[str] | None = None) -> dict[OfferKey, SpotQuote]:
        with self._lock:
            wanted = self.accelerators() if names is None else names
            for name in sorted({a.lower() for a in wanted} - self._read_names):
                self._quotes.update({q.key: q for q in self._read(name)})
                self._read_names.add(name)
            return self._quotes

    def quotes_for(self, names: Iterable[str], when: datetime) -> list[SpotQuote]:
        """The catalog's offers of just these accelerators (read once each, then kept)."""
        wanted = {n.lower() for n in names}
        if not wanted:
            return []
        return [replace(q, observed_at=when) for q in self._load(wanted).values() if q.accelerator.lower() in wanted]

    def _read(self, name: str) -> list[SpotQuote]:
        epoch = datetime.fromtimestamp(0).astimezone()
        quotes: list[SpotQuote] = []
        for cloud in self.clouds:
            listing = self.catalog.list_accelerators(gpus_only=True, name_filter=name, clouds=cloud,
                                                     case_sensitive=False, all_regions=True, require_price=True)
            for listed, infos in listing.items():
                if listed.lower() == name:
                    for info in infos:
                        quotes += self._zones(cloud, info, epoch)
        return quotes

    def _zones(self, cloud: str, info: Any, epoch: datetime) -> list[SpotQuote]:
        if not info.instance_type or not float(info.accelerator_count).is_integer():
            return []
        regions = self.catalog.get_region_zones_for_instance_type(info.instance_type, True, clouds=cloud)
        out: list[SpotQuote] = []
        for region in regions:
            if region.name != info.region:
                continue
            zones = [z.name for z in region.zones] if region.zones else [region.name]
            for zone in zones:
                spot = _price(info.spot_price)
                if region.zones:
                    spot = _price(self.catalog.get_hourly_cost(info.instance_type, True, region.name, zone,
                                                               clouds=cloud)) or spot
                out.append(SpotQuote(cloud, region.name, zone, info.instance_type, info.accelerator_name,
                                     int(info.accelerator_count), spot, _price(info.price), epoch,
                                     gpu_memory_gb=_price(info.device_memory)))
        return out

    def quotes(self, when: datetime) -> list[SpotQuote]:
        return [replace(q, observed_at=when) for q in self._load().values()]

    def quote(self, key: OfferKey, when: datetime) -> SpotQuote:
        found = self._load().get(key)
        if found is None:
            return SpotQuote(key.cloud, key.region, key.zone, key.instance_type, "", 0, None, None, when)
        return replace(found, observed_at=when)
