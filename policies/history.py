"""What a selection policy may know about the market's past: prices and capacity per zone up to now.

``MarketSeries`` holds whole ``[tick, zone]`` arrays once (a trace, or a price book's recent rows);
``MarketHistory(series, now)`` is the policy's view of it up to and including tick ``now``. Building
a view is O(1), so the simulator can hand one to the policy at every tick. Everything derived
(availability runs, their ages, prefix counts) is computed once per series and gang size, and every
query reads only rows ``<= now``: a policy cannot see the future through a history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from providers.base import OfferKey


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class GangSeries:
    """Capacity facts for one gang size, derived causally (row t depends on rows <= t only)."""

    up: np.ndarray  # [tick, zone] bool: available_nodes >= num_nodes
    age: np.ndarray  # [tick, zone] int: ticks the zone has been in its current up/down state, >= 1
    cum_up: np.ndarray  # [tick + 1, zone] int: up ticks before each tick
    run_end: tuple[np.ndarray, ...]  # per zone: tick at which each finished up-run was seen to end
    run_length: tuple[np.ndarray, ...]  # per zone: that run's length in ticks
    down_end: tuple[np.ndarray, ...]  # per zone: tick at which each finished down-run ended
    down_length: tuple[np.ndarray, ...]

    @classmethod
    def build(cls, available_nodes: np.ndarray, num_nodes: int) -> GangSeries:
        up = available_nodes >= num_nodes
        ticks, zones = up.shape
        age = np.ones(up.shape, dtype=np.int64)
        for t in range(1, ticks):
            same = up[t] == up[t - 1]
            age[t, same] = age[t - 1, same] + 1
        cum_up = np.zeros((ticks + 1, zones), dtype=np.int64)
        np.cumsum(up, axis=0, out=cum_up[1:])
        run_end: list[np.ndarray] = []
        run_length: list[np.ndarray] = []
        down_end: list[np.ndarray] = []
        down_length: list[np.ndarray] = []
        for z in range(zones):
            flips = np.flatnonzero(up[1:, z] != up[:-1, z]) + 1  # ticks where the state changed
            ended_up = flips[~up[flips, z]]  # up -> down at these ticks
            ended_down = flips[up[flips, z]]
            run_end.append(_frozen(ended_up))
            run_length.append(_frozen(age[ended_up - 1, z]))
            down_end.append(_frozen(ended_down))
            down_length.append(_frozen(age[ended_down - 1, z]))
        return cls(_frozen(up), _frozen(age), _frozen(cum_up), tuple(run_end), tuple(run_length),
                   tuple(down_end), tuple(down_length))


class MarketSeries:
    """A market's whole arrays, immutable; per-gang derived arrays are built on first use."""

    def __init__(self, locations: tuple[str, ...], regions: tuple[str, ...], tick_seconds: float,
                 spot_price: np.ndarray, on_demand_price: np.ndarray, available_nodes: np.ndarray) -> None:
        if not (spot_price.shape == on_demand_price.shape == available_nodes.shape):
            raise ValueError("spot_price, on_demand_price and available_nodes must have one shape [tick, zone]")
        if spot_price.shape[1] != len(locations) or len(regions) != len(locations):
            raise ValueError("one location and one region per zone column expected")
        self.locations = locations
        self.regions = regions  # "cloud/region": where a checkpoint written in that zone lives
        self.tick_seconds = float(tick_seconds)
        self.spot_price = _frozen(spot_price)
        self.on_demand_price = _frozen(on_demand_price)
        self.available_nodes = _frozen(available_nodes)
        self.column = {loc: i for i, loc in enumerate(locations)}
        self._gangs: dict[int, GangSeries] = {}
        # Derived facts policies compute from this series (pure functions of it), kept so that the
        # next tick's call does not redo them. Keys are chosen by the policy module that fills them.
        self.memo: dict[object, object] = {}

    @classmethod
    def from_trace(cls, trace: Any) -> MarketSeries:
        """From a ``providers.trace.MarketTrace`` (or anything with its fields)."""
        return cls(
            locations=tuple(str(OfferKey(z.cloud, z.region, z.zone, z.instance_type)) for z in trace.zones),
            regions=tuple(f"{z.cloud}/{z.region}" for z in trace.zones),
            tick_seconds=trace.tick_seconds,
            spot_price=trace.spot_price,
            on_demand_price=trace.on_demand_price,
            available_nodes=trace.available_nodes,
        )

    @property
    def num_ticks(self) -> int:
        return int(self.spot_price.shape[0])

    def gang(self, num_nodes: int) -> GangSeries:
        found = self._gangs.get(num_nodes)
        if found is None:
            found = self._gangs[num_nodes] = GangSeries.build(self.available_nodes, num_nodes)
        return found


@dataclass(frozen=True, slots=True)
class MarketHistory:
    """The market up to and including tick ``now`` of ``series``."""

    series: MarketSeries
    now: int

    @property
    def tick_seconds(self) -> float:
        return self.series.tick_seconds

    @property
    def locations(self) -> tuple[str, ...]:
        return self.series.locations

    def column(self, location: str) -> int | None:
        return self.series.column.get(location)

    @property
    def spot_price(self) -> np.ndarray:
        return self.series.spot_price[: self.now + 1]

    @property
    def on_demand_price(self) -> np.ndarray:
        return self.series.on_demand_price[: self.now + 1]

    @property
    def available_nodes(self) -> np.ndarray:
        return self.series.available_nodes[: self.now + 1]

    def age(self, num_nodes: int) -> np.ndarray:
        """Ticks each zone has been in its current state (up or down), counting now."""
        return self.series.gang(num_nodes).age[self.now]

    def availability(self, num_nodes: int, window: int) -> np.ndarray:
        """Fraction of the last ``window`` ticks (up to now) each zone could take the gang."""
        cum = self.series.gang(num_nodes).cum_up
        lo = max(0, self.now + 1 - window)
        return (cum[self.now + 1] - cum[lo]) / max(1, self.now + 1 - lo)

    def finished_up_runs(self, num_nodes: int, zone: int, window: int) -> np.ndarray:
        """Lengths (ticks) of the zone's up-runs that ended within the last ``window`` ticks."""
        gang = self.series.gang(num_nodes)
        return ended_within(gang.run_end[zone], gang.run_length[zone], self.now, window)

    def finished_down_runs(self, num_nodes: int, zone: int, window: int) -> np.ndarray:
        gang = self.series.gang(num_nodes)
        return ended_within(gang.down_end[zone], gang.down_length[zone], self.now, window)


def ended_within(ends: np.ndarray, lengths: np.ndarray, now: int, window: int) -> np.ndarray:
    """The ``lengths`` of the spells whose ``ends`` fall in the ``window`` ticks up to ``now``."""
    hi = int(np.searchsorted(ends, now, side="right"))
    lo = int(np.searchsorted(ends, now - window, side="right"))
    return lengths[lo:hi]
