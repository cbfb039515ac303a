"""One GPU type's Market page: its few cheapest zones charted over the last week, and its offers now."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_

from broker.store import Store
from broker.store.tables import PriceQuoteRow
from broker.web.html import e, table
from broker.web.market import BUCKETS, HISTORY, NO_RUNS, OFFERS_SHOWN, TOP_ZONES, _price, load_hazards, load_offers
from broker.web.overview import chart_div
from broker.web.times import duration


def load_gpu_type(store: Store, gpu: str, now: datetime, clock_now: datetime | None = None) -> dict[str, Any] | None:
    """A GPU type's offers now, and the history of its ``TOP_ZONES`` cheapest (None: no such GPU type quoted)."""
    since = now - HISTORY
    with store.transaction() as s:
        offers = [o for o in load_offers(s, since, {"accelerator": gpu}) if not o.cpu_only]
        if not offers:
            return None
        hazards = load_hazards(s, clock_now or now)  # clusters are on the broker's clock
        live = sorted((o for o in offers if not o.stale and o.spot is not None),
                      key=lambda o: (o.per_gpu(o.spot), o.cloud, o.zone))
        top = live[:TOP_ZONES]
        q = PriceQuoteRow
        history = list(s.execute(
            select(q.cloud, q.zone, q.instance_type, q.gpus_per_node, q.spot_price, q.on_demand_price,
                   q.observed_at, q.confirmed_at)
            .where(q.accelerator == gpu, q.confirmed_at >= since,
                   tuple_(q.cloud, q.zone, q.instance_type).in_([(o.cloud, o.zone, o.instance_type) for o in top]))
            .order_by(q.observed_at))) if top else []
    ranked = sorted(offers, key=lambda o: (o.stale, o.per_gpu(o.spot) if o.spot is not None else float("inf")))
    return {"gpu": gpu, "now": now, "since": since, "offers": ranked, "top": top, "history": history,
            "hazards": hazards}


def history_chart(data: dict[str, Any]) -> str:
    """USD per GPU-hour of the cheapest zones, the last quote of each time bucket carried forward, and the
    cheapest on-demand; each legend entry carries its latest value."""
    since, now = data["since"], data["now"]
    step = max((now - since).total_seconds() / BUCKETS, 60.0)
    xs = [int(since.timestamp() + i * step) for i in range(BUCKETS + 1)]
    spot: dict[str, list[float | None]] = defaultdict(lambda: [None] * len(xs))
    demand: list[float | None] = [None] * len(xs)
    clouds: dict[str, str] = {}
    for cloud, zone, itype, gpus, spot_price, od_price, observed, confirmed in data["history"]:
        key = f"{cloud}/{zone} {itype}"
        clouds[key] = cloud
        first = max(int((observed.timestamp() - since.timestamp()) // step), 0)
        last = min(int((confirmed.timestamp() - since.timestamp()) // step), len(xs) - 1)
        for i in range(first, last + 1):
            if spot_price is not None:
                spot[key][i] = round(spot_price / max(gpus, 1), 4)
            if od_price is not None:
                value = round(od_price / max(gpus, 1), 4)
                demand[i] = value if demand[i] is None else min(demand[i] or value, value)
    for values in (*spot.values(), demand):
        for i in range(1, len(values)):  # a quote stands until the next one changes it
            if values[i] is None:
                values[i] = values[i - 1]

    def latest(values: list[float | None]) -> str:
        known = [v for v in values if v is not None]
        return f"now ${known[-1]:,.3f}" if known else "no quote now"

    keys = [f"{o.cloud}/{o.zone} {o.instance_type}" for o in data["top"] if f"{o.cloud}/{o.zone} {o.instance_type}"
            in spot]
    palette = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00")
    series: list[dict[str, object]] = [
        {"label": f"{k} spot ({latest(spot[k])})", "colour": palette[i % len(palette)], "values": spot[k],
         "cloud": clouds[k]} for i, k in enumerate(keys)]
    if any(v is not None for v in demand):
        series.append({"label": f"cheapest on-demand ({latest(demand)})", "colour": "#222222",
                       "values": demand, "dash": True})
    return chart_div({"x": xs, "series": series, "ylabel": "USD per GPU-hour", "legend": "static"},
                     f"{data['gpu']}: spot price in its {len(keys)} cheapest zone(s) now, and the cheapest "
                     f"on-demand, USD per GPU-hour, last 7 days")


def render_gpu_type(data: dict[str, Any]) -> str:
    now, hazards = data["now"], data["hazards"]
    rows = []
    for o in data["offers"][:OFFERS_SHOWN]:
        hazard = hazards.get((o.cloud, o.zone, o.instance_type), NO_RUNS)
        rows.append([e(f"{o.cloud}/{o.zone}"), e(o.instance_type), str(o.gpus), _price(o.per_gpu(o.spot)),
                     _price(o.per_gpu(o.on_demand)), e(o.capacity), e(hazard.text()),
                     e(duration((now - o.confirmed_at).total_seconds())), "stale" if o.stale else ""])
    more = len(data["offers"]) - OFFERS_SHOWN
    tail = f'<p>{more} more offer(s), dearer, not listed.</p>' if more > 0 else ""
    chart = history_chart(data) if data["top"] else '<p class="empty">No live spot quote to chart.</p>'
    return (f'<p><a href="/market">All GPU types</a></p>{chart}'
            f'<h2>Its offers now, cheapest spot per GPU-hour first ({len(data["offers"])})</h2>'
            + table(["zone", "instance", "GPUs", "spot $/GPU-h", "on-demand $/GPU-h", "capacity signal",
                     "preemptions/day (learned)", "quote age", ""], rows, 'class="market offers"') + tail)
