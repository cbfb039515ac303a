"""GCP ``advice.capacityHistory`` (Compute Engine v1): a Spot machine type's past in one region.

``POST /compute/v1/projects/{project}/regions/{region}/advice/capacityHistory`` with
``instanceProperties.machineType``, ``scheduling.provisioningModel: SPOT`` and ``types:
[PREEMPTION, PRICE]`` (no ``locationPolicy``: the path's region) answers

- ``preemptionHistory``: per interval (a day, bounded at midnight Pacific time, over the last 30
  days), ``preemptionRate``: the share of the Spot VMs that stopped that day that were preempted
  (0-1);
- ``priceHistory``: per interval, ``listPrice`` (a ``Money``: ``currencyCode``, ``units`` as a
  string, ``nanos``), the Spot list price of the machine type per hour.

The newest interval's rate goes on the quote of every zone of the region
(``SpotQuote.preemption_rate``); the whole history backfills the price book (``history_quotes``).
One request per GPU machine type and region, as ``advice.capacity`` asks, keeps a refresh's
request count (a zone each would be three times as many; ``locationPolicy.location`` can name a
zone where that is worth it). The answer changes once a day, so it is cached for hours. Every
field is checked alone and refused with a note naming it; the rest of the answer is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from providers import capacity
from providers.base import SpotQuote

MAX_RECORDS = 400  # 30 days of daily records; an answer with more is cut here, with a note
MAX_PRICE_PER_HOUR = 10_000.0  # USD per VM-hour: more is not a Spot price
MAX_NANOS = 999_999_999
CACHE_S = 6 * 3600.0  # the history changes once a day


@dataclass(frozen=True, slots=True)
class Interval:
    start: datetime
    end: datetime
    value: float  # preemption rate (0-1) or USD per hour


@dataclass(frozen=True, slots=True)
class CapacityHistory:
    preemption: tuple[Interval, ...] = ()
    prices: tuple[Interval, ...] = ()

    @property
    def latest_rate(self) -> float | None:
        return max(self.preemption, key=lambda i: i.end).value if self.preemption else None


def history_request(machine_type: str) -> dict[str, object]:
    """The ``CapacityHistoryRequest`` body for one Spot machine type in the path's region."""
    return {"instanceProperties": {"machineType": machine_type, "scheduling": {"provisioningModel": "SPOT"}},
            "types": ["PREEMPTION", "PRICE"]}


def _time(value: object, field: str) -> datetime:
    if not isinstance(value, str) or len(value) > 40:
        raise capacity.FieldRefused(f"{field}: not an RFC 3339 time ({capacity._show(value)})")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise capacity.FieldRefused(f"{field}: not an RFC 3339 time ({capacity._show(value)})") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _interval(record: dict[str, object], field: str) -> tuple[datetime, datetime]:
    interval = record.get("interval")
    if not isinstance(interval, dict):
        raise capacity.FieldRefused(f"{field}.interval: missing")
    start = _time(interval.get("startTime"), f"{field}.interval.startTime")
    end = _time(interval.get("endTime"), f"{field}.interval.endTime")
    if end <= start or end - start > timedelta(days=31):
        raise capacity.FieldRefused(
            f"{field}.interval: not a span of up to 31 days ({start:%Y-%m-%d} to {end:%Y-%m-%d})")
    return start, end


def usd_per_hour(money: object, field: str) -> float:
    """A ``Money`` in US dollars: ``units`` (an int64 as a string) plus ``nanos``."""
    if not isinstance(money, dict):
        raise capacity.FieldRefused(f"{field}: missing")
    if money.get("currencyCode", "USD") != "USD":
        raise capacity.FieldRefused(f"{field}.currencyCode: not USD ({capacity._show(money.get('currencyCode'))})")
    units, nanos = money.get("units", "0"), money.get("nanos", 0)
    if not isinstance(units, (str, int)) or isinstance(units, bool) or not str(units).lstrip("-").isdigit() \
            or len(str(units)) > 12:
        raise capacity.FieldRefused(f"{field}.units: not an integer ({capacity._show(units)})")
    if isinstance(nanos, bool) or not isinstance(nanos, int) or abs(nanos) > MAX_NANOS:
        raise capacity.FieldRefused(f"{field}.nanos: not an integer within a unit ({capacity._show(nanos)})")
    value = int(units) + nanos / 1e9
    if not math.isfinite(value) or not 0 <= value <= MAX_PRICE_PER_HOUR:
        raise capacity.FieldRefused(f"{field}: out of range 0-{MAX_PRICE_PER_HOUR:g} ({value:g})")
    return value


def parse_history(answer: object, where: str, note: Callable[[str], None]) -> CapacityHistory:
    """The usable records of a ``CapacityHistoryResponse``; each refused one is a note."""
    prefix = f"gcp: advice.capacityHistory {where}"
    if not isinstance(answer, dict):
        note(f"{prefix}: not an object; no history")
        return CapacityHistory()
    found: dict[str, list[Interval]] = {"preemptionHistory": [], "priceHistory": []}
    for key, records in found.items():
        listed = answer.get(key, [])
        if not isinstance(listed, list):
            note(f"{prefix}: {key}: not a list; skipped")
            continue
        if len(listed) > MAX_RECORDS:
            note(f"{prefix}: {key}: {len(listed)} records; the first {MAX_RECORDS} kept")
        for i, record in enumerate(listed[:MAX_RECORDS]):
            field = f"{key}[{i}]"
            try:
                if not isinstance(record, dict):
                    raise capacity.FieldRefused(f"{field}: not an object")
                start, end = _interval(record, field)
                value = (capacity.probability(record.get("preemptionRate"), f"{field}.preemptionRate")
                         if key == "preemptionHistory" else usd_per_hour(record.get("listPrice"), f"{field}.listPrice"))
            except capacity.FieldRefused as exc:
                note(f"{prefix}: {exc}; refused")
                continue
            records.append(Interval(start, end, value))
    return CapacityHistory(tuple(sorted(found["preemptionHistory"], key=lambda i: i.start)),
                           tuple(sorted(found["priceHistory"], key=lambda i: i.start)))


def with_latest_rates(quotes: list[SpotQuote], histories: dict[tuple[str, str], CapacityHistory]) -> list[SpotQuote]:
    """The quotes with the newest preemption rate of their (region, machine type), where there is one."""
    out = []
    for q in quotes:
        history = histories.get((q.region, q.instance_type))
        rate = history.latest_rate if history is not None and q.gpus_per_node else None
        out.append(q if rate is None else replace(q, preemption_rate=rate))
    return out


def history_quotes(now_quotes: Iterable[SpotQuote], histories: dict[tuple[str, str], CapacityHistory],
                   since: datetime) -> list[SpotQuote]:
    """Past quotes from the histories for the price book: one per price interval that ends after
    ``since``, at the interval's start, with the preemption rate of the day it falls in. What the
    history does not carry (on-demand price, GPUs, region) is the current quote's."""
    found: list[SpotQuote] = []
    for q in now_quotes:
        history = histories.get((q.region, q.instance_type))
        if history is None or not q.gpus_per_node:
            continue
        for price in history.prices:
            if price.end <= since:
                continue
            rate = next((p.value for p in history.preemption if p.start <= price.start < p.end), None)
            found.append(replace(q, spot_price=round(price.value, 6), observed_at=max(price.start, since),
                                 preemption_rate=rate, obtainability=None, estimated_uptime_s=None,
                                 capacity_score=None, placement_level=None, available_nodes=None, stale=False))
    return found
