"""Market: spot and on-demand price history per accelerator and zone, capacity signals, zones avoided."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from broker.engine import AVOID_ZONE_FOR
from broker.store import Store
from broker.store.tables import ClusterRow, JobEventRow, JobRow, NoticeRow, PriceQuoteRow
from broker.web.html import cloud_colour, e, table
from broker.web.overview import chart_div
from broker.web.session import Viewer

HISTORY = timedelta(days=7)
BUCKETS = 168  # points per chart at most
MAX_QUOTE_ROWS = 200_000


def load_market(store: Store, viewer: Viewer, now: datetime) -> dict[str, Any]:
    since = now - HISTORY
    with store.transaction() as s:
        quotes = list(s.execute(
            select(PriceQuoteRow.cloud, PriceQuoteRow.zone, PriceQuoteRow.instance_type, PriceQuoteRow.accelerator,
                   PriceQuoteRow.gpus_per_node, PriceQuoteRow.spot_price, PriceQuoteRow.on_demand_price,
                   PriceQuoteRow.capacity_score, PriceQuoteRow.available_nodes, PriceQuoteRow.stale,
                   PriceQuoteRow.observed_at, PriceQuoteRow.confirmed_at)
            .where(PriceQuoteRow.confirmed_at >= since).order_by(PriceQuoteRow.observed_at)
            .limit(MAX_QUOTE_ROWS)))
        scope = [] if viewer.scope is None else [JobRow.team == viewer.scope]
        notices = list(s.execute(
            select(ClusterRow.cloud, ClusterRow.zone, NoticeRow.kind, NoticeRow.received_at, ClusterRow.job_id)
            .join(ClusterRow, ClusterRow.id == NoticeRow.cluster_id).join(JobRow, JobRow.id == ClusterRow.job_id)
            .where(NoticeRow.received_at >= now - AVOID_ZONE_FOR, *scope)))
        failed = list(s.execute(
            select(JobEventRow.at, JobEventRow.detail, JobEventRow.job_id).join(JobRow, JobRow.id == JobEventRow.job_id)
            .where(JobEventRow.kind == "launch_failed", JobEventRow.at >= now - AVOID_ZONE_FOR, *scope)))
    return {"since": since, "now": now, "quotes": quotes, "notices": notices, "failed": failed}


def _history_chart(rows: list[Any], since: datetime, now: datetime, accelerator: str) -> str:
    """USD per GPU-hour per zone, the last quote of each time bucket carried forward."""
    step = max((now - since).total_seconds() / BUCKETS, 60.0)
    xs = [int(since.timestamp() + i * step) for i in range(BUCKETS + 1)]
    spot: dict[str, list[float | None]] = defaultdict(lambda: [None] * len(xs))
    demand: dict[str, list[float | None]] = defaultdict(lambda: [None] * len(xs))
    clouds: dict[str, str] = {}
    for cloud, zone, _itype, _acc, gpus, spot_price, od_price, *_rest, observed, confirmed in rows:
        key = f"{cloud}/{zone}"
        clouds[key] = cloud
        first = max(int((observed.timestamp() - since.timestamp()) // step), 0)
        last = min(int((confirmed.timestamp() - since.timestamp()) // step), len(xs) - 1)
        for i in range(first, last + 1):
            if spot_price is not None:
                spot[key][i] = round(spot_price / max(gpus, 1), 4)
            if od_price is not None:
                demand[cloud][i] = round(od_price / max(gpus, 1), 4)
    for values in (*spot.values(), *demand.values()):
        for i in range(1, len(values)):  # a quote stands until the next one changes it
            if values[i] is None:
                values[i] = values[i - 1]
    names = sorted(spot)
    series: list[dict[str, object]] = [{"label": f"{k} spot", "colour": cloud_colour(clouds[k]), "values": spot[k]}
                                       for k in names]
    series += [{"label": f"{c} on-demand", "colour": cloud_colour(c), "values": demand[c], "dash": True}
               for c in sorted(demand)]
    return chart_div({"x": xs, "series": series, "ylabel": "USD per GPU-hour"},
                     f"{accelerator}: spot price per zone and on-demand per cloud, USD per GPU-hour")


def render(data: dict[str, Any]) -> str:
    quotes = data["quotes"]
    by_acc: dict[str, list[Any]] = defaultdict(list)
    latest: dict[tuple[str, str, str], Any] = {}
    for row in quotes:
        by_acc[row[3]].append(row)
        latest[(row[0], row[1], row[2])] = row
    parts = []
    if not quotes:
        parts.append('<p class="empty">The price book has no quotes in the last 7 days: run '
                     '<code>broker prices poll</code> or let the service poll.</p>')
    for accelerator in sorted(by_acc):
        parts.append(_history_chart(by_acc[accelerator], data["since"], data["now"], accelerator))
    rows = []
    for (cloud, zone, itype), r in sorted(latest.items()):
        gpus, spot_price, od, score, nodes, stale, confirmed = r[4], r[5], r[6], r[7], r[8], r[9], r[11]
        rows.append([e(cloud), e(zone), e(itype), e(f"{r[3]}×{gpus}"),
                     e("-" if spot_price is None else f"${spot_price:,.3f}"), e("-" if od is None else f"${od:,.3f}"),
                     e("-" if score is None else f"{score:g}"), e("-" if nodes is None else str(nodes)),
                     "stale" if stale else "", f"{confirmed:%Y-%m-%d %H:%M}"])
    parts.append("<h2>Latest quotes and capacity signals</h2>")
    parts.append(table(["cloud", "zone", "instance", "GPUs", "spot $/node-h", "on-demand $/node-h",
                        "capacity score", "nodes available", "", "last seen"], rows))
    avoided = [[e(f"{cloud}/{zone}"), e(f"{kind} notice"), f"{at:%Y-%m-%d %H:%M}",
                f"{at + AVOID_ZONE_FOR:%H:%M}", f'<a href="/jobs/{e(job)}">{e(job)}</a>']
               for cloud, zone, kind, at, job in data["notices"]]
    for at, detail, job in data["failed"]:
        detail = detail or {}
        avoided.append([e(f"{detail.get('cloud', '')}/{detail.get('zone', '?')}".lstrip("/")),
                        e(f"launch failed: {str(detail.get('reason') or detail.get('error') or '')[:120]}"),
                        f"{at:%Y-%m-%d %H:%M}", f"{at + AVOID_ZONE_FOR:%H:%M}",
                        f'<a href="/jobs/{e(job)}">{e(job)}</a>'])
    parts.append(f"<h2>Zones avoided (for {AVOID_ZONE_FOR.total_seconds() / 3600:g} h after a notice or a failed "
                 "launch)</h2>")
    parts.append(table(["zone", "why", "since", "until", "job"], avoided) if avoided
                 else '<p class="empty">No zone is being avoided.</p>')
    return "".join(parts)
