"""The market trace format shared by the simulator, the local backend and the benchmarks.

``time,cloud,region,zone,instance_type,accelerator,gpus_per_node,spot_price,on_demand_price,available_nodes``
one row per (tick, zone), all zones on the same evenly spaced ticks, prices in USD per node-hour.

Optional columns carry the clouds' capacity signals where a trace has them (an empty cell: the
cloud said nothing): ``capacity_score`` (AWS, 1-10), ``obtainability`` (GCP, 0-1),
``estimated_uptime_s`` (GCP, seconds), ``placement_level`` (Azure: High, Medium or Low) and
``preemption_rate`` (GCP's daily Spot preemption rate, 0-1). A trace without them, or with only
some, is read as before.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import zlib
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from providers.base import OfferKey, ProviderInputError, SpotQuote
from providers.bounded import capped_lines

COLUMNS: tuple[str, ...] = (
    "time",
    "cloud",
    "region",
    "zone",
    "instance_type",
    "accelerator",
    "gpus_per_node",
    "spot_price",
    "on_demand_price",
    "available_nodes",
)

# Optional columns: the capacity signals, each with its valid range (placement_level: its words).
SIGNAL_COLUMNS: tuple[str, ...] = (
    "capacity_score", "obtainability", "estimated_uptime_s", "placement_level", "preemption_rate")
SIGNAL_RANGES: dict[str, tuple[float, float]] = {
    "capacity_score": (1.0, 10.0), "obtainability": (0.0, 1.0), "estimated_uptime_s": (0.0, 366 * 86400.0),
    "preemption_rate": (0.0, 1.0)}
PLACEMENT_LEVELS: tuple[str, ...] = ("Low", "Medium", "High")  # coded 1, 2, 3 in the arrays


def signal_values(quote: Any) -> tuple[float, ...]:
    """A quote's (or price-book row's) capacity signals in ``SIGNAL_COLUMNS`` order, NaN where unknown."""
    level = getattr(quote, "placement_level", None)
    coded = float(PLACEMENT_LEVELS.index(level) + 1) if level in PLACEMENT_LEVELS else math.nan
    values = [getattr(quote, name, None) for name in SIGNAL_COLUMNS]
    return tuple(coded if name == "placement_level" else math.nan if v is None else float(v)
                 for name, v in zip(SIGNAL_COLUMNS, values, strict=True))


# The most GPUs per node or nodes per zone a row may name (int64 arrays hold them).
MAX_COUNT = 1_000_000
# Rows and characters (after decompression) of a trace: the largest published one has about 181,000
# rows and 15 MB; these bound the memory a trace can ask for before the arrays are sized.
MAX_ROWS = 2_000_000
MAX_TRACE_CHARS = 512 * 1024 * 1024
# Prices, per node-hour: above this is a broken row (1e308 made every cost infinite).
MAX_PRICE = 100_000.0
# Ticks times zones of the dense arrays (about 25 bytes each): a trace with a stray far-off
# timestamp would otherwise ask for terabytes.
MAX_CELLS = 10_000_000


class TraceError(ProviderInputError, ValueError):
    """A trace file that does not follow the format; the message names the row and the column."""


def parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class TraceZone:
    """One column of the trace: an instance type in a zone, with its static facts."""

    key: OfferKey
    accelerator: str
    gpus_per_node: int

    @property
    def cloud(self) -> str:
        return self.key.cloud

    @property
    def region(self) -> str:
        return self.key.region

    @property
    def zone(self) -> str:
        return self.key.zone

    @property
    def instance_type(self) -> str:
        return self.key.instance_type


@dataclass(frozen=True)
class MarketTrace:
    """A whole trace as dense arrays: ``[tick, zone]`` for prices and availability.

    Missing (tick, zone) rows are filled with the previous tick's values, as the format asks.
    Arrays are read-only so that snapshots handed to policies cannot be changed under them.
    """

    start: datetime
    tick_seconds: float
    zones: tuple[TraceZone, ...]
    spot_price: np.ndarray
    on_demand_price: np.ndarray
    available_nodes: np.ndarray
    # SIGNAL_COLUMNS name -> [tick, zone] floats, NaN where unknown; only the signals the trace carries
    signals: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_ticks(self) -> int:
        return int(self.spot_price.shape[0])

    @property
    def end(self) -> datetime:
        return self.time_of(self.num_ticks)

    def time_of(self, tick: int) -> datetime:
        return self.start + timedelta(seconds=self.tick_seconds * tick)

    def tick_at(self, when: datetime) -> int:
        """The tick in force at ``when`` (clamped to the trace)."""
        offset = (when - self.start).total_seconds() / self.tick_seconds
        return max(0, min(self.num_ticks - 1, int(offset)))

    def select(self, accelerator: str | None = None, gpus_per_node: int | None = None,
               instance_types: Collection[str] = ()) -> MarketTrace:
        """The sub-trace of zones whose accelerator and GPUs per node match (and whose instance type is
        one of ``instance_types``, unless that is empty)."""
        keep = [
            i
            for i, z in enumerate(self.zones)
            if (accelerator is None or z.accelerator.lower() == accelerator.lower())
            and (gpus_per_node is None or z.gpus_per_node == gpus_per_node)
            and (not instance_types or z.instance_type in instance_types)
        ]
        return MarketTrace(
            start=self.start,
            tick_seconds=self.tick_seconds,
            zones=tuple(self.zones[i] for i in keep),
            spot_price=_frozen(self.spot_price[:, keep]),
            on_demand_price=_frozen(self.on_demand_price[:, keep]),
            available_nodes=_frozen(self.available_nodes[:, keep]),
            signals={name: _frozen(values[:, keep]) for name, values in self.signals.items()},
        )

    def signals_at(self, tick: int, zone: int) -> dict[str, Any]:
        """The SpotQuote fields of the capacity signals at (tick, zone); None where unknown."""
        found: dict[str, Any] = {}
        for name, values in self.signals.items():
            value = float(values[tick, zone])
            if math.isnan(value):
                continue
            found[name] = PLACEMENT_LEVELS[int(value) - 1] if name == "placement_level" else value
        return found

    def quotes_at(self, tick: int) -> list[SpotQuote]:
        when = self.time_of(tick)
        return [
            SpotQuote(
                cloud=z.cloud,
                region=z.region,
                zone=z.zone,
                instance_type=z.instance_type,
                accelerator=z.accelerator,
                gpus_per_node=z.gpus_per_node,
                spot_price=float(self.spot_price[tick, i]),
                on_demand_price=float(self.on_demand_price[tick, i]),
                observed_at=when,
                available_nodes=int(self.available_nodes[tick, i]),
                **self.signals_at(tick, i),
            )
            for i, z in enumerate(self.zones)
        ]


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_trace(path: str | Path) -> MarketTrace:
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such market trace")
    if path.is_dir():
        raise TraceError(f"{path}: a directory, not a market trace")
    try:
        with _open_text(path) as handle:
            return parse_trace(capped_lines(handle, str(path), TraceError, MAX_TRACE_CHARS), source=str(path))
    except gzip.BadGzipFile:
        raise TraceError(f"{path}: named .gz but not gzip data; expected a gzipped CSV market trace") from None
    except (EOFError, zlib.error):
        raise TraceError(f"{path}: truncated or corrupt gzip data") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not text (byte {exc.start} is not UTF-8); expected a CSV market trace") from None
    except csv.Error as exc:
        raise TraceError(f"{path}: not a CSV market trace ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the market trace: {exc.strerror or exc}") from None


def parse_trace(lines: Iterable[str], source: str = "<trace>") -> MarketTrace:
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(f"{source}: empty file, expected a header {','.join(COLUMNS)}") from None
    header = [h.strip() for h in header]
    if any("\x00" in h for h in header):
        raise TraceError(f"{source}:1: the header holds a NUL byte; not a CSV market trace")
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{source}: header lacks column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}")
    col = {name: header.index(name) for name in COLUMNS}
    signal_col = {name: header.index(name) for name in SIGNAL_COLUMNS if name in header}

    zone_index: dict[OfferKey, int] = {}
    zones: list[TraceZone] = []
    times: dict[datetime, int] = {}
    cells: list[tuple[int, int, float, float, int]] = []
    signal_cells: list[tuple[float, ...]] = []
    line_of: dict[tuple[int, int], int] = {}  # (tick, zone) -> the line that gave it
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(cells) >= MAX_ROWS:
            raise TraceError(f"{source}:{lineno}: more than {MAX_ROWS} rows")
        if len(row) < len(header):
            raise TraceError(f"{source}:{lineno}: {len(row)} columns, expected {len(header)}")
        for name, index in (*col.items(), *signal_col.items()):
            if "\x00" in row[index] or len(row[index]) > 200:
                raise TraceError(f"{source}:{lineno}: column {name}: a NUL byte or over 200 characters")
        try:
            when = parse_time(row[col["time"]])
        except ValueError:
            raise TraceError(f"{source}:{lineno}: column time: expected an ISO 8601 timestamp, "
                             f"got {row[col['time']]!r}") from None
        key = OfferKey(row[col["cloud"]], row[col["region"]], row[col["zone"]], row[col["instance_type"]])
        values = {}
        for name, kind in (("gpus_per_node", int), ("spot_price", float), ("on_demand_price", float),
                           ("available_nodes", int)):
            text = row[col[name]].strip()
            try:
                number = float(text)
            except ValueError:
                raise TraceError(f"{source}:{lineno}: column {name}: expected a number, "
                                 f"got {text[:40]!r}") from None
            if not math.isfinite(number) or number < 0:
                raise TraceError(f"{source}:{lineno}: column {name}: expected a non-negative number, got {text!r}")
            if kind is int and (number != int(number) or number > MAX_COUNT):
                raise TraceError(f"{source}:{lineno}: column {name}: expected a whole number up to {MAX_COUNT}, "
                                 f"got {text!r}")
            if kind is float and not 0 < number <= MAX_PRICE:
                raise TraceError(f"{source}:{lineno}: column {name}: expected a price above 0 and at most "
                                 f"{MAX_PRICE:,.0f} per node-hour, got {text!r}")
            values[name] = int(number) if kind is int else number
        if key not in zone_index:
            zone_index[key] = len(zones)
            zones.append(TraceZone(key, row[col["accelerator"]], int(values["gpus_per_node"])))
        tick = times.setdefault(when, len(times))
        first = line_of.setdefault((tick, zone_index[key]), lineno)
        if first != lineno:
            raise TraceError(f"{source}:{lineno}: a second row for {key.zone} {key.instance_type} at "
                             f"{format_time(when)} (the first is line {first}); expected one row per tick and zone")
        cells.append((tick, zone_index[key], values["spot_price"], values["on_demand_price"],
                      int(values["available_nodes"])))
        signal_cells.append(tuple(_signal(name, row[index].strip(), f"{source}:{lineno}")
                                  for name, index in signal_col.items()))
    if not cells:
        raise TraceError(f"{source}: no rows")

    ordered = sorted(times)
    if len(ordered) > 1:
        steps = np.diff(np.array([t.timestamp() for t in ordered]))
        tick_seconds = float(np.min(steps))  # larger steps are missing ticks
    else:
        tick_seconds = 60.0
    if tick_seconds <= 0:
        raise TraceError(f"{source}: ticks must be evenly spaced and increasing")
    start = ordered[0]
    num_ticks = round((ordered[-1] - start).total_seconds() / tick_seconds) + 1
    if num_ticks * max(len(zones), 1) > MAX_CELLS:
        raise TraceError(f"{source}: column time: {format_time(start)} to {format_time(ordered[-1])} in steps of "
                         f"{tick_seconds:g} s is {num_ticks} ticks; at most {MAX_CELLS // max(len(zones), 1)} "
                         f"for {len(zones)} zone(s)")
    slot_of = {t: round((t - start).total_seconds() / tick_seconds) for t in ordered}
    order = {times[t]: slot_of[t] for t in ordered}

    shape = (num_ticks, len(zones))
    spot = np.full(shape, np.nan)
    on_demand = np.full(shape, np.nan)
    avail = np.full(shape, -1, dtype=np.int64)
    signals = {name: np.full(shape, np.nan) for name in signal_col}
    for (tick, zone, sp, od, av), found in zip(cells, signal_cells, strict=True):
        slot = order[tick]
        spot[slot, zone], on_demand[slot, zone], avail[slot, zone] = sp, od, av
        for name, value in zip(signal_col, found, strict=True):
            signals[name][slot, zone] = value
    no_row = avail == -1  # a missing row repeats the tick before; an empty signal cell stays unknown
    for column in signals.values():
        _fill_from_before(column, no_row)
    for array, empty in ((spot, None), (on_demand, None), (avail, -1)):
        _forward_fill(array, empty)
    if np.isnan(spot[0]).any() or (avail[0] < 0).any():
        raise TraceError(f"{source}: every zone needs a row at the first tick {format_time(start)}")
    return MarketTrace(start, tick_seconds, tuple(zones), _frozen(spot), _frozen(on_demand), _frozen(avail),
                       {name: _frozen(column) for name, column in signals.items()})


def _signal(name: str, text: str, where: str) -> float:
    """One optional signal cell: empty is unknown (NaN); anything else must be in its range."""
    if not text:
        return math.nan
    if name == "placement_level":
        if text not in PLACEMENT_LEVELS:
            raise TraceError(f"{where}: column placement_level: expected High, Medium, Low or empty, got {text[:40]!r}")
        return float(PLACEMENT_LEVELS.index(text) + 1)
    low, high = SIGNAL_RANGES[name]
    try:
        number = float(text)
    except ValueError:
        raise TraceError(f"{where}: column {name}: expected a number or empty, got {text[:40]!r}") from None
    if not low <= number <= high:  # NaN fails this too
        raise TraceError(f"{where}: column {name}: expected a number from {low:g} to {high:g} or empty, "
                         f"got {text[:40]!r}")
    return number


def _forward_fill(array: np.ndarray, empty: int | None) -> None:
    _fill_from_before(array, np.isnan(array) if empty is None else array == empty)


def _fill_from_before(array: np.ndarray, missing: np.ndarray) -> None:
    """Each cell where ``missing`` takes the value of the nearest cell above it that is not (in one
    pass of NumPy, not a loop over the ticks: a long trace has millions of them)."""
    rows = np.arange(array.shape[0])[:, None]
    source = np.maximum.accumulate(np.where(missing, 0, rows), axis=0)
    array[...] = np.take_along_axis(array, source, axis=0)


def trace_rows(quotes: Iterable[SpotQuote], signals: bool = False) -> Iterator[list[str]]:
    for q in quotes:
        row = [
            format_time(q.observed_at), q.cloud, q.region, q.zone, q.instance_type, q.accelerator,
            str(q.gpus_per_node), f"{q.spot_price:.4f}" if q.spot_price is not None else "",
            f"{q.on_demand_price:.4f}" if q.on_demand_price is not None else "",
            str(q.available_nodes if q.available_nodes is not None else 0),
        ]
        if signals:
            row += ["" if q.capacity_score is None else f"{q.capacity_score:g}",
                    "" if q.obtainability is None else f"{q.obtainability:.4g}",
                    "" if q.estimated_uptime_s is None else f"{q.estimated_uptime_s:g}",
                    q.placement_level or "",
                    "" if q.preemption_rate is None else f"{q.preemption_rate:.4g}"]
        yield row


def write_trace(path: str | Path, quotes: Iterable[SpotQuote], signals: bool = False) -> int:
    """Write quotes (already one per (tick, zone), in time order) as a trace; returns rows written.
    ``signals``: with the optional capacity-signal columns."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    rows = 0
    with opener(path, "wt", encoding="utf-8", newline="") as handle:  # type: ignore[operator]
        writer = csv.writer(handle)
        writer.writerow((*COLUMNS, *SIGNAL_COLUMNS) if signals else COLUMNS)
        for row in trace_rows(quotes, signals):
            writer.writerow(row)
            rows += 1
    return rows
