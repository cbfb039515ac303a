"""What the SkyPilot dry run shows: the ranked offers, and SkyPilot's own output kept off the terminal.

SkyPilot's client prints its progress as ``<sky-payload>`` markup on stdout and logs tracebacks
when it cannot reach its catalog; ``captured`` takes file descriptors 1 and 2 (and Python's
``sys.stdout``/``sys.stderr``) into a file while SkyPilot runs, and ``clean_output`` keeps only the
lines a person should read.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from providers.base import OfferKey, SpotQuote

if TYPE_CHECKING:
    from broker.market.price_market import SourcedQuote
    from broker.store import Store
    from policies.selection import Plan, ZoneRecord

MAX_CAPTURED = 1_000_000  # bytes of SkyPilot's output kept; the rest is dropped
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_MARKUP = re.compile(r"\[/?[a-z ]+\]")


def clean_output(text: str) -> str:
    """SkyPilot's output without payload markup, colour codes, rich tags or tracebacks."""
    kept: list[str] = []
    in_traceback = False
    for raw in text.replace("\x00", "").splitlines():
        line = _MARKUP.sub("", _ANSI.sub("", raw)).rstrip()
        if "<sky-payload>" in line or "</sky-payload>" in line:
            continue
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
            continue
        if in_traceback:
            if line.startswith((" ", "\t")) or not line:
                continue
            in_traceback = False
            continue  # the exception line that ends a traceback
        if line.startswith(("The above exception", "During handling of the above")):
            continue
        kept.append(line)
    return "\n".join(kept)


@dataclass
class Captured:
    text: str = ""
    dropped: bool = False

    def lines(self) -> list[str]:
        return [line for line in clean_output(self.text).splitlines() if line.strip()]


@contextlib.contextmanager
def captured() -> Iterator[Captured]:
    """Everything written to stdout/stderr inside, by Python or by a library's own file descriptors."""
    out = Captured()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        text = open(os.dup(sink.fileno()), "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        old_out, old_err = sys.stdout, sys.stderr
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            sys.stdout = sys.stderr = text
            yield out
        finally:
            text.flush()
            sys.stdout, sys.stderr = old_out, old_err
            text.close()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            data = sink.read(MAX_CAPTURED + 1)
            out.dropped = len(data) > MAX_CAPTURED
            out.text = data[:MAX_CAPTURED].decode("utf-8", errors="replace")


def zone_history(store: Store) -> dict[str, ZoneRecord]:
    """The broker's own record of every spot zone: preemptions and failed launches."""
    from broker.engine.planning import zone_records

    with store.transaction() as s:
        return zone_records(s)


def _history(quotes: list[SpotQuote] | None) -> dict[str, Any] | None:
    spots = [q.spot_price for q in quotes or [] if q.spot_price is not None]
    if not spots:
        return None
    return {"spot_min": min(spots), "spot_max": max(spots), "changes": len(spots) - 1}


def ranked_offers(plan: Plan, nodes: int, offers: list[SourcedQuote], records: dict[str, ZoneRecord],
                  now: datetime, history: dict[OfferKey, list[SpotQuote]] | None = None) -> list[dict[str, Any]]:
    """The plan's places in order, each with its price for the gang, its quote's age and source, and
    its spot price over the last day (``history``: the price book's changes per offer)."""
    from policies.selection import ON_DEMAND

    by_key = {(o.quote.cloud, o.quote.zone, o.quote.instance_type): o for o in offers}
    ranked: list[dict[str, Any]] = []
    for rank, location in enumerate(plan.locations, 1):
        offer = location.offer
        if offer is None:
            ranked.append({"rank": rank, "kind": location.kind, "cloud": None, "region": None, "zone": None,
                           "instance_type": None, "spot": None, "price_per_node_hour": None, "price_per_hour": None,
                           "quote_age_s": None, "source": None, "stale": False})
            continue
        sourced = by_key.get((offer.cloud, offer.zone, offer.instance_type))
        record = records.get(offer.location)
        price = offer.on_demand_price if location.kind == ON_DEMAND else offer.spot_price
        ranked.append({
            "rank": rank, "kind": location.kind, "cloud": offer.cloud, "region": offer.region, "zone": offer.zone,
            "instance_type": offer.instance_type, "accelerator": offer.accelerator,
            "gpus_per_node": offer.gpus_per_node, "spot": location.kind != ON_DEMAND,
            "price_per_node_hour": round(price, 6), "price_per_hour": round(price * nodes, 6),
            "quote_age_s": None if sourced is None or sourced.age_s is None else round(sourced.age_s, 1),
            "source": sourced.source if sourced is not None else None,
            "stale": bool(sourced is not None and sourced.quote.stale),
            "capacity_score": offer.capacity_score, "available_nodes": offer.available_nodes,
            "preemptions": len(record.preemptions) if record else 0,
            "failed_launches": len(record.failed_launches) if record else 0,
            "spot_last_24h": _history((history or {}).get(
                OfferKey(offer.cloud, offer.region, offer.zone, offer.instance_type))),
        })
    return ranked
