"""Market: where each GPU type is cheapest now and how reliable that is; a page per GPU type; zones avoided.

The price book can hold thousands of offers (every zone and instance type of three clouds), so the
Market page shows one row per GPU type (its cheapest spot offer now, its zone, the cheapest
on-demand, the saving, the capacity signal and the hazard the broker learned there, the quote's
age), sortable, filterable by cloud, region and GPU type, and paginated. A GPU type's own page
charts its few cheapest zones over the last week. CPU-only offers are listed apart.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote as url_quote

from sqlalchemy import func, select

from broker.engine.planning import AVOID_ZONE_FOR
from broker.errors import UserError
from broker.model import ClusterState, TeardownReason
from broker.store import Store
from broker.store.tables import ClusterRow, JobEventRow, JobRow, NoticeRow, PriceQuoteRow
from broker.web.html import e, query, table
from broker.web.session import Viewer
from broker.web.times import Times, duration
from policies.checkpointing import blended_hazard

HISTORY = timedelta(days=7)
BUCKETS = 168  # points per chart at most
PAGE_SIZE = 50
TOP_ZONES = 5  # zones charted on a GPU type's page
OFFERS_SHOWN = 100  # a GPU type's offers listed on its page, cheapest first
MAX_TEXT = 100
SORTS = {"gpu": "GPU type", "spot": "spot $/GPU-h", "on_demand": "on-demand $/GPU-h", "saving": "saving",
         "hazard": "preemptions/day", "age": "quote age", "zones": "zones"}
CPU = "cpu"  # the kind of the CPU-only listing


class MarketQueryError(UserError):
    """A filter, sort or page the Market page cannot take; the message names the field."""

    http_status = 400


def _text(name: str, value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > MAX_TEXT or any(ord(c) < 32 or 0xD800 <= ord(c) < 0xE000 for c in value):
        raise MarketQueryError(f"{name}: expected at most {MAX_TEXT} characters of text")
    return value


@dataclass(frozen=True)
class MarketFilter:
    cloud: str | None = None
    region: str | None = None
    gpu: str | None = None
    sort: str = "spot"
    desc: bool = False
    page: int = 1
    kind: str = "gpu"  # or CPU: the CPU-only offers, one row per instance type

    @classmethod
    def parse(cls, params: Any) -> MarketFilter:
        sort, order, page = params.get("sort") or "spot", params.get("order") or "asc", params.get("page") or "1"
        if sort not in SORTS:
            raise MarketQueryError(f"sort: expected one of {', '.join(SORTS)}")
        if order not in ("asc", "desc"):
            raise MarketQueryError("order: expected asc or desc")
        if not (page.isdigit() and len(page) <= 6 and int(page) >= 1):
            raise MarketQueryError("page: expected a whole number from 1")
        kind = params.get("kind") or "gpu"
        if kind not in ("gpu", CPU):
            raise MarketQueryError("kind: expected gpu or cpu")
        return cls(_text("cloud", params.get("cloud")), _text("region", params.get("region")),
                   _text("gpu", params.get("gpu")), sort, order == "desc", int(page), kind)

    def link(self, **changes: Any) -> str:
        f = replace(self, **changes)
        return ("/market" + query(cloud=f.cloud, region=f.region, gpu=f.gpu, kind=None if f.kind == "gpu" else f.kind,
                                 sort=None if f.sort == "spot" else f.sort, order="desc" if f.desc else None,
                                 page=None if f.page == 1 else f.page)).rstrip("?")


@dataclass(frozen=True)
class Offer:
    """An offer's latest quote."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    gpus: int
    spot: float | None
    on_demand: float | None
    capacity_score: float | None
    available_nodes: int | None
    stale: bool
    confirmed_at: datetime

    @property
    def cpu_only(self) -> bool:
        return self.gpus <= 0 or not self.accelerator

    def per_gpu(self, price: float | None) -> float | None:
        return None if price is None else price / max(self.gpus, 1)

    @property
    def capacity(self) -> str:
        bits = ([f"score {self.capacity_score:g}"] if self.capacity_score is not None else []) + \
               ([f"{self.available_nodes} node(s) free"] if self.available_nodes is not None else [])
        return ", ".join(bits) or "no signal"


@dataclass(frozen=True)
class Hazard:
    """What the broker saw of spot preemptions in one (cloud, zone, instance type)."""

    preemptions: int
    seconds: float  # spot time it ran there

    @property
    def per_day(self) -> float:
        """As the checkpoint cadence learns it (``engine/cadence.zone_hazard``), with its default prior."""
        return 86400 * blended_hazard(self.preemptions, self.seconds)

    def text(self) -> str:
        if not self.seconds:
            return "no runs yet (prior: 1/day)"
        return f"{self.per_day:.2f}/day ({self.preemptions} in {duration(self.seconds)} run)"


NO_RUNS = Hazard(0, 0.0)


@dataclass(frozen=True)
class GpuRow:
    """One GPU type's line: its cheapest spot offer now, and the cheapest on-demand."""

    gpu: str
    best: Offer | None  # None: no live spot quote, on-demand only
    on_demand: float | None  # cheapest on-demand, USD per GPU-hour
    zones: int
    hazard: Hazard
    age_s: float

    @property
    def spot(self) -> float | None:
        return self.best.per_gpu(self.best.spot) if self.best else None

    @property
    def saving(self) -> float | None:
        if self.spot is None or not self.on_demand:
            return None
        return 1 - self.spot / self.on_demand


def load_offers(s: Any, since: datetime, where: dict[str, Any] | None = None) -> list[Offer]:
    """The latest quote of every offer confirmed since ``since`` (the newest row of each: ids grow with time)."""
    q = PriceQuoteRow
    newest = select(func.max(q.id)).where(q.confirmed_at >= since)
    for column, value in (where or {}).items():
        newest = newest.where(getattr(q, column) == value)
    newest = newest.group_by(q.cloud, q.zone, q.instance_type)
    rows = s.execute(select(q.cloud, q.region, q.zone, q.instance_type, q.accelerator, q.gpus_per_node, q.spot_price,
                            q.on_demand_price, q.capacity_score, q.available_nodes, q.stale, q.confirmed_at)
                     .where(q.id.in_(newest.scalar_subquery())))
    return [Offer(*row) for row in rows]


def load_hazards(s: Any, now: datetime) -> dict[tuple[str, str, str], Hazard]:
    """Per (cloud, zone, instance type): cloud preemptions and spot seconds run, in one grouped read."""
    c = ClusterRow
    found: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for cloud, zone, itype, up_at, ended, state, reason in s.execute(
            select(c.cloud, c.zone, c.instance_type, c.up_at, c.terminated_at, c.state, c.teardown_reason)
            .where(c.spot.is_(True), c.up_at.is_not(None))):
        entry = found[(cloud, zone, itype)]
        entry[1] += max(((ended or now) - up_at).total_seconds(), 0.0)
        entry[0] += int(state == ClusterState.TERMINATED.value and reason == TeardownReason.CLOUD.value)
    return {key: Hazard(int(p), float(sec)) for key, (p, sec) in found.items()}


def gpu_rows(offers: list[Offer], hazards: dict[tuple[str, str, str], Hazard], now: datetime) -> list[GpuRow]:
    by_gpu: dict[str, list[Offer]] = defaultdict(list)
    for offer in offers:
        if not offer.cpu_only:
            by_gpu[offer.accelerator].append(offer)
    rows = []
    for gpu, group in by_gpu.items():
        live = [o for o in group if not o.stale]
        spot = [o for o in live if o.spot is not None]
        best = min(spot, key=lambda o: (o.per_gpu(o.spot), o.cloud, o.zone, o.instance_type)) if spot else None
        demand = [p for o in live if (p := o.per_gpu(o.on_demand)) is not None]
        shown = best or (live or group)[0]
        rows.append(GpuRow(gpu, best, min(demand) if demand else None, len({(o.cloud, o.zone) for o in live}),
                           hazards.get((shown.cloud, shown.zone, shown.instance_type), NO_RUNS),
                           (now - shown.confirmed_at).total_seconds()))
    return rows


def _sort_key(sort: str) -> Any:
    far = float("inf")
    keys = {"gpu": lambda r: r.gpu.lower(), "spot": lambda r: (r.spot if r.spot is not None else far, r.gpu),
            "on_demand": lambda r: (r.on_demand if r.on_demand is not None else far, r.gpu),
            "saving": lambda r: (r.saving if r.saving is not None else -far, r.gpu),
            "hazard": lambda r: (r.hazard.per_day, r.gpu), "age": lambda r: (r.age_s, r.gpu),
            "zones": lambda r: (r.zones, r.gpu)}
    return keys[sort]


def load_market(store: Store, viewer: Viewer, now: datetime, where: MarketFilter,
                clock_now: datetime | None = None) -> dict[str, Any]:
    """Everything the Market page shows. ``now`` is the wall clock (the price book's pollers stamp quotes on
    it); ``clock_now`` the broker's (clusters, notices and launches are on it: the market's, on a replay)."""
    since, clock_now = now - HISTORY, clock_now or now
    with store.transaction() as s:
        offers = load_offers(s, since)
        hazards = load_hazards(s, clock_now)
        avoided = _avoided(s, viewer, clock_now)
    choices = {"cloud": sorted({o.cloud for o in offers}), "region": sorted({o.region for o in offers}),
               "gpu": sorted({o.accelerator for o in offers if not o.cpu_only}, key=str.lower)}
    chosen = [o for o in offers if (where.cloud is None or o.cloud == where.cloud)
              and (where.region is None or o.region == where.region)
              and (where.gpu is None or o.accelerator.lower() == where.gpu.lower())]
    return {"now": now, "choices": choices, "avoided": avoided, "offers": len(offers),
            "rows": sorted(gpu_rows(chosen, hazards, now), key=_sort_key(where.sort), reverse=where.desc),
            "cpu": sorted((o for o in chosen if o.cpu_only),
                          key=lambda o: (o.spot if o.spot is not None else float("inf"), o.instance_type)),
            "cpu_total": sum(1 for o in offers if o.cpu_only)}


def _avoided(s: Any, viewer: Viewer, now: datetime) -> list[tuple[str, str, datetime, str]]:
    scope = [] if viewer.scope is None else [JobRow.team == viewer.scope]
    found = [(f"{cloud}/{zone}", f"{kind} notice", at, job) for cloud, zone, kind, at, job in s.execute(
        select(ClusterRow.cloud, ClusterRow.zone, NoticeRow.kind, NoticeRow.received_at, ClusterRow.job_id)
        .join(ClusterRow, ClusterRow.id == NoticeRow.cluster_id).join(JobRow, JobRow.id == ClusterRow.job_id)
        .where(NoticeRow.received_at >= now - AVOID_ZONE_FOR, *scope))]
    for at, detail, job in s.execute(
            select(JobEventRow.at, JobEventRow.detail, JobEventRow.job_id).join(JobRow, JobRow.id == JobEventRow.job_id)
            .where(JobEventRow.kind == "launch_failed", JobEventRow.at >= now - AVOID_ZONE_FOR, *scope)):
        detail = detail or {}
        found.append((f"{detail.get('cloud', '')}/{detail.get('zone', '?')}".lstrip("/"),
                      f"launch failed: {str(detail.get('reason') or detail.get('error') or '')[:120]}", at, job))
    return found


def _price(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"${value:,.{digits}f}"


def _pages(where: MarketFilter, total: int) -> tuple[int, int, str]:
    """(first index, last index, the pager's HTML) of the page asked for."""
    last_page = max((total + PAGE_SIZE - 1) // PAGE_SIZE, 1)
    page = min(where.page, last_page)
    links = []
    if page > 1:
        links.append(f'<a rel="prev" href="{e(where.link(page=page - 1))}">‹ previous</a>')
    links.append(f"page {page} of {last_page}")
    if page < last_page:
        links.append(f'<a rel="next" href="{e(where.link(page=page + 1))}">next ›</a>')
    return (page - 1) * PAGE_SIZE, page * PAGE_SIZE, f'<p class="pager">{" · ".join(links)}</p>'


def _filters(where: MarketFilter, choices: dict[str, list[str]]) -> str:
    selects = []
    for name in ("cloud", "region", "gpu"):
        chosen = getattr(where, name)
        options = "".join(f'<option{" selected" if v == chosen else ""}>{e(v)}</option>' for v in choices[name])
        selects.append(f'<label>{"GPU type" if name == "gpu" else name} <select name="{name}">'
                       f'<option value="">any</option>{options}</select></label>')
    kind = f'<input type="hidden" name="kind" value="{CPU}">' if where.kind == CPU else ""
    return f'<form class="filters" method="get" action="/market">{"".join(selects)}{kind}<button>Filter</button></form>'


def _heads(where: MarketFilter) -> str:
    cells = []
    for key, label in (("gpu", "GPU type"), ("spot", "cheapest spot $/GPU-h"), (None, "where"),
                       ("on_demand", "cheapest on-demand $/GPU-h"), ("saving", "saving"), (None, "capacity signal"),
                       ("hazard", "preemptions/day (learned)"), ("age", "quote age"), ("zones", "zones")):
        if key is None:
            cells.append(f"<th>{label}</th>")
            continue
        # A first click sorts the natural way (cheapest, fewest, A to Z; the largest saving); a second reverses.
        desc = not where.desc if where.sort == key else key in ("saving", "zones")
        arrow = (" ▼" if where.desc else " ▲") if where.sort == key else ""
        href = where.link(sort=key, desc=desc, page=1)
        cells.append(f'<th><a href="{e(href)}">{label}{arrow}</a></th>')
    return "".join(cells)


def render(data: dict[str, Any], where: MarketFilter) -> str:
    parts = [_filters(where, data["choices"])]
    if not data["offers"]:
        parts.append('<p class="empty">The price book has no quotes in the last 7 days: run '
                     '<code>broker prices poll</code> or let the service poll.</p>')
    if where.kind == CPU:
        return "".join(parts) + _cpu_table(data, where) + _avoided_html(data)
    rows = data["rows"]
    first, last, pager = _pages(where, len(rows))
    body = []
    for r in rows[first:last]:
        best = r.best
        where_html = (f"{e(best.cloud)}/{e(best.zone)} <small>{e(best.instance_type)} ({best.gpus} GPU)</small>"
                      if best else "no live spot quote")
        saving = "-" if r.saving is None else f"{100 * r.saving:.0f}%"
        body.append(f'<tr data-gpu="{e(r.gpu)}"><td><a href="/market/gpu/{e(url_quote(r.gpu, safe=""))}">'
                    f'{e(r.gpu)}</a></td><td>{_price(r.spot)}</td><td>{where_html}</td><td>{_price(r.on_demand)}</td>'
                    f'<td>{saving}</td><td>{e(best.capacity if best else "-")}</td>'
                    f'<td title="{e(r.hazard.text())}">{e(r.hazard.text())}</td>'
                    f'<td>{e(duration(r.age_s))}</td><td>{r.zones}</td></tr>')
    empty = '<tr><td colspan="9" class="empty">No GPU offer matches.</td></tr>' if not rows else ""
    parts.append(f"<h2>GPU types: the cheapest spot offer of each now ({len(rows)})</h2>"
                 f'<table class="market"><thead><tr>{_heads(where)}</tr></thead>'
                 f'<tbody>{"".join(body)}{empty}</tbody></table>{pager}')
    cpu = len(data["cpu"])
    parts.append(f'<p class="cpu-offers">{cpu} CPU-only offer(s) (no GPU) are listed apart: '
                 f'<a href="{e(where.link(kind=CPU, page=1, sort="spot", desc=False))}">CPU-only offers</a>.</p>')
    return "".join(parts) + _avoided_html(data)


def _cpu_table(data: dict[str, Any], where: MarketFilter) -> str:
    offers = data["cpu"]
    first, last, pager = _pages(where, len(offers))
    rows = [[e(o.instance_type), e(f"{o.cloud}/{o.zone}"), _price(o.spot), _price(o.on_demand),
             "stale" if o.stale else "", e(duration((data["now"] - o.confirmed_at).total_seconds()))]
            for o in offers[first:last]]
    return (f'<h2>CPU-only offers ({len(offers)}), cheapest spot first</h2>'
            f'<p><a href="{e(where.link(kind="gpu", page=1))}">Back to GPU types</a></p>'
            + table(["instance", "zone", "spot $/node-h", "on-demand $/node-h", "", "quote age"], rows,
                    'class="market cpu"') + pager)


def _avoided_html(data: dict[str, Any]) -> str:
    times: Times = data["times"]
    rows = [[e(zone), e(why), times.at(at), times.at(at + AVOID_ZONE_FOR), f'<a href="/jobs/{e(job)}">{e(job)}</a>']
            for zone, why, at, job in data["avoided"]]
    title = (f"<h2>Zones avoided (for {AVOID_ZONE_FOR.total_seconds() / 3600:g} h after a notice or a failed "
             "launch)</h2>")
    return title + (table(["zone", "why", "since", "until", "job"], rows) if rows
                    else '<p class="empty">No zone is being avoided.</p>')
