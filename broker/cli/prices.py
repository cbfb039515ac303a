"""``broker prices``: live spot and on-demand GPU prices from the price book, polled on demand."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.cli.app import ConfigOption, JsonOption, UsageError, app

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


MAX_BACKFILL_DAYS = 90  # AWS keeps 90 days of spot price history
MAX_DURATION = timedelta(days=3660)
MAX_PRICE_PER_GPU_HOUR = 100_000.0
MAX_GPUS_PER_NODE = 1024


def parse_duration(text: str, option: str, longest: timedelta = MAX_DURATION) -> timedelta:
    match = DURATION.match(text[:64])
    seconds = float(match.group(1)) * UNIT_SECONDS[match.group(2)] if match else 0.0
    if not 0 < seconds <= longest.total_seconds():  # a 400-digit number is inf, and too long
        raise UsageError(f"{option}: expected a duration like 7d, 12h, 30m or 90s, at most "
                         f"{longest.days} days, got {text[:80]!r}")
    return timedelta(seconds=seconds)


def parse_clouds(text: str | None) -> tuple[str, ...]:
    from providers.base import PUBLIC_CLOUDS

    if not text:
        return PUBLIC_CLOUDS
    clouds = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [c for c in clouds if c not in PUBLIC_CLOUDS]
    if unknown or not clouds:
        raise UsageError(f"--cloud: unknown cloud {unknown[0] if unknown else text!r}; expected a comma-separated "
                         f"list of {', '.join(PUBLIC_CLOUDS)}")
    return clouds


@dataclass(frozen=True)
class Row:
    """One offer as shown: the quote plus the figures the table sorts and prints."""

    quote: Any  # SpotQuote
    price: float  # per node-hour, the one asked for (spot unless --on-demand)
    per_gpu: float
    saving: float | None
    age_seconds: float


# A group whose callback is the command: `broker prices ...` then works whatever else the app holds
# (Typer runs a lone command as the whole app), and leaves room for subcommands.
prices_app = typer.Typer(add_completion=False, subcommand_metavar="")
app.add_typer(prices_app, name="prices")


@prices_app.callback(invoke_without_command=True)
def prices(
    gpu: Annotated[str | None, typer.Option("--gpu", help="accelerator, e.g. H100, A100-80GB, L4")] = None,
    min_gpus: Annotated[int | None, typer.Option("--min-gpus", help="at least this many GPUs per node")] = None,
    cloud: Annotated[str | None, typer.Option("--cloud", help="comma-separated: aws,gcp,azure")] = None,
    region: Annotated[str | None, typer.Option("--region", help="one region, e.g. us-east-1")] = None,
    spot: Annotated[bool, typer.Option("--spot", help="spot offers only, by spot price")] = False,
    on_demand: Annotated[bool, typer.Option("--on-demand", help="by on-demand price")] = False,
    max_price: Annotated[float | None, typer.Option("--max-price",
                                                    help="at most this USD per GPU-hour")] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="poll the clouds now, then show")] = False,
    as_json: JsonOption = False,
    export_trace: Annotated[Path | None, typer.Option("--export-trace", help="write the window as a market trace "
                                                      "(.csv or .csv.gz)")] = None,
    since: Annotated[str, typer.Option("--since", help="window of --export-trace, back from now")] = "7d",
    tick: Annotated[str, typer.Option("--tick", help="tick spacing of --export-trace")] = "5m",
    history: Annotated[str | None, typer.Option(
        "--history", help="poll, and also store this far back of the clouds' own price history (AWS spot price "
                          f"history, GCP capacityHistory), e.g. 14d; at most {MAX_BACKFILL_DAYS}d")] = None,
    config: ConfigOption = None,
) -> None:
    """Spot and on-demand GPU prices, cheapest per GPU-hour first."""
    from broker.cli.app import console, err_console

    clouds = parse_clouds(cloud)  # every option checked before the settings, the store and the market are imported
    if spot and on_demand:
        raise UsageError("--spot and --on-demand: choose one")
    if min_gpus is not None and not 1 <= min_gpus <= MAX_GPUS_PER_NODE:
        raise UsageError(f"--min-gpus: expected a whole number of GPUs from 1 to {MAX_GPUS_PER_NODE}, "
                         f"got {str(min_gpus)[:20]}")
    if max_price is not None and not 0 < max_price <= MAX_PRICE_PER_GPU_HOUR:  # NaN fails both
        raise UsageError(f"--max-price: expected a positive USD price per GPU-hour up to "
                         f"{MAX_PRICE_PER_GPU_HOUR:g}, got {max_price:g}")
    window = parse_duration(since, "--since")
    tick_span = parse_duration(tick, "--tick")
    backfill_days = 0.0
    if history is not None:
        backfill_days = parse_duration(history, "--history").total_seconds() / 86400
        if backfill_days > MAX_BACKFILL_DAYS:
            raise UsageError(f"--history: at most {MAX_BACKFILL_DAYS}d (the clouds keep no more), got {history[:40]!r}")
        refresh = True
    if export_trace is not None and not (export_trace.name.endswith(".csv") or export_trace.name.endswith(".csv.gz")):
        raise UsageError(f"--export-trace {export_trace}: expected a .csv or .csv.gz file name")
    from broker.config.settings import load_settings
    from broker.market.book import NoQuotes, PriceBook, QuoteFilter
    from broker.store import open_store

    settings = load_settings(config)
    store = open_store(settings.database_url)
    try:
        book = PriceBook(store)
        accelerator = _accelerator(gpu, book) if gpu is not None else None
        polls = _refresh(book, settings, clouds, region, show_progress=not as_json,
                         backfill_days=backfill_days) if refresh else []
        where = QuoteFilter(clouds=clouds, accelerator=accelerator, min_gpus=min_gpus,
                            regions=(region,) if region else None)
        if export_trace is not None:
            now = datetime.now(UTC)
            try:
                export = book.export_trace(export_trace, since=now - window, until=now,
                                           tick_seconds=tick_span.total_seconds(), where=where)
            except NoQuotes as exc:
                raise UsageError(f"--export-trace: {exc}; poll with `broker prices --refresh` first") from None
            if as_json:
                console.print_json(json.dumps({
                    "path": str(export.path), "rows": export.rows, "zones": export.zones, "ticks": export.ticks,
                    "start": export.start.isoformat(), "tick_seconds": export.tick_seconds,
                    "polls": [_poll_json(p) for p in polls]}))
            else:
                console.print(f"wrote {export.rows} rows ({export.zones} zones x {export.ticks} ticks of "
                              f"{_age(export.tick_seconds)}) from {export.start:%Y-%m-%d %H:%M} UTC to {export.path}")
            if refresh:
                _fail_if_nothing_polled(polls)
            return
        rows = _rows(book.latest(where), spot=spot, on_demand=on_demand, max_price=max_price)
        if as_json:
            console.print_json(json.dumps({"quotes": [_row_json(r) for r in rows],
                                           "polls": [_poll_json(p) for p in polls]}))
        elif not rows:
            err_console.print("no quotes match" + ("" if refresh else "; poll with `broker prices --refresh`"))
        else:
            console.print(_table(rows, on_demand=on_demand))
    finally:
        store.dispose()
    if refresh:
        _fail_if_nothing_polled(polls)


def _fail_if_nothing_polled(polls: list[Any]) -> None:
    """--refresh could not do what was asked when no cloud answered: say why on stderr and exit 1."""
    if any(p.status == "ok" for p in polls):
        return
    from broker.cli.app import err_console

    what = ", ".join(f"{p.cloud} {p.status}" for p in polls) or "no SDK installed"
    err_console.print(f"error: --refresh: no cloud could be polled ({what}); anything shown is from earlier "
                      "polls", highlight=False, markup=False, soft_wrap=True)
    # Not typer.Exit: with standalone_mode=False click returns its code and main() drops it.
    raise SystemExit(1)


def _accelerator(gpu: str, book: Any) -> str:
    """The catalog's spelling of ``gpu``, or a name the clouds have quoted (e.g. a GPU newer than the catalog)."""
    from providers import catalog

    known = catalog.canonical_accelerator(gpu)
    if known:
        return known
    quoted = {name.lower(): name for name in book.accelerators()}
    if gpu.strip().lower() in quoted:
        return quoted[gpu.strip().lower()]
    names = sorted(set(catalog.ACCELERATORS) | set(quoted.values()))
    raise UsageError(f"--gpu: unknown accelerator {gpu!r}; expected one of {', '.join(names)}")


def _refresh(book: Any, settings: Any, clouds: tuple[str, ...], region: str | None, show_progress: bool,
             backfill_days: float = 0.0) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from broker.cli.app import err_console
    from broker.market.polling import poll_prices
    from providers.sdk import missing_sdk
    from providers.sources import price_sources

    for cloud in clouds:
        if (reason := missing_sdk(cloud)) is not None:
            err_console.print(f"{cloud}: {reason}; skipped", highlight=False, markup=False, soft_wrap=True)
    clouds = tuple(c for c in clouds if missing_sdk(c) is None)
    if not clouds:
        return []
    sources = price_sources(settings, clouds)
    if backfill_days:
        for source in sources.values():
            if hasattr(source, "backfill_days"):
                source.backfill_days = backfill_days
    with Progress(TextColumn("{task.description:<6}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True,
                  disable=not (show_progress and err_console.is_terminal)) as bar:
        tasks = {c: bar.add_task(c, total=None) for c in clouds}
        polls = poll_prices(book, sources, regions=[region] if region else None,
                            progress=lambda c, done, total: bar.update(tasks[c], completed=done, total=total))
    for poll in polls:
        err_console.print(poll.line, highlight=False, markup=False)
        for note in poll.notes:
            err_console.print(f"  {note}", highlight=False, markup=False)
    return polls


def _rows(quotes: list[Any], spot: bool, on_demand: bool, max_price: float | None) -> list[Row]:
    now = datetime.now(UTC)
    rows = []
    for q in quotes:
        price = q.on_demand_price if on_demand else q.spot_price
        if price is None and not (spot or on_demand):
            price = q.on_demand_price
        if price is None or q.gpus_per_node <= 0:
            continue
        per_gpu = price / q.gpus_per_node
        if max_price is not None and per_gpu > max_price:
            continue
        saving = (1 - q.spot_price / q.on_demand_price
                  if q.spot_price is not None and q.on_demand_price else None)
        rows.append(Row(q, price, per_gpu, saving, (now - q.observed_at).total_seconds()))
    rows.sort(key=lambda r: (r.per_gpu, r.quote.cloud, r.quote.zone, r.quote.instance_type))
    return rows


def _table(rows: list[Row], on_demand: bool) -> Any:
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, justify in (("cloud", "left"), ("zone", "left"), ("instance type", "left"), ("GPUs", "left"),
                          ("$/GPU-h", "right"), ("spot $/h", "right"), ("on-demand $/h", "right"),
                          ("saving", "right"), ("capacity", "right"), ("age", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in rows:
        q = r.quote
        age = _age(r.age_seconds) + (" [red]stale[/red]" if q.stale else "")
        table.add_row(
            q.cloud, q.zone, q.instance_type, f"{q.gpus_per_node}x{q.accelerator}",
            f"{r.per_gpu:.3f}" + ("" if on_demand or q.spot_price is not None else " od"),
            _money(q.spot_price), _money(q.on_demand_price),
            f"{r.saving:.0%}" if r.saving is not None else "-",
            _capacity(q), age,
        )
    return table


def _capacity(q: Any) -> str:
    """The cloud's capacity signal on the 1-10 scale decisions use (docs/capacity-signals.md)."""
    from broker.market.capacity import capacity_score_of

    score = capacity_score_of(q)
    return "-" if score is None else f"{score:.2g}/10"


def _money(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _row_json(r: Row) -> dict[str, Any]:
    q = r.quote
    return {
        "cloud": q.cloud, "region": q.region, "zone": q.zone, "instance_type": q.instance_type,
        "accelerator": q.accelerator, "gpus_per_node": q.gpus_per_node, "gpu_memory_gb": q.gpu_memory_gb,
        "spot_price": q.spot_price, "on_demand_price": q.on_demand_price, "price_per_gpu_hour": round(r.per_gpu, 6),
        "saving": round(r.saving, 4) if r.saving is not None else None, "capacity_score": q.capacity_score,
        "obtainability": q.obtainability, "estimated_uptime_s": q.estimated_uptime_s,
        "placement_level": q.placement_level, "preemption_rate": q.preemption_rate,
        "observed_at": q.observed_at.isoformat(), "age_seconds": round(r.age_seconds, 1), "stale": q.stale,
    }


def _poll_json(p: Any) -> dict[str, Any]:
    return {"cloud": p.cloud, "status": p.status, "quotes": p.quotes, "seconds": round(p.seconds, 2),
            "message": p.line, "notes": p.notes}
