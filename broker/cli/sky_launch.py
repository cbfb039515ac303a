"""``broker launch --backend skypilot`` before the engine starts: the price book refreshed when its
quotes for the job are old (``broker.intake`` judged the job by those quotes first)."""

from __future__ import annotations

from broker.config.settings import Settings
from broker.market.book import PriceBook
from broker.spec.job import JobSpec
from broker.store import Store


def refresh_prices(store: Store, settings: Settings, spec: JobSpec) -> list[str]:
    """Poll the clouds when the newest quote for the job's accelerators is older than
    ``price_max_age_seconds``; one line per cloud polled (none when the book was fresh)."""
    from broker.cli.sky_output import captured
    from broker.market.polling import refresh_if_old

    with captured():  # the cloud SDKs' own chatter (credential probes) stays off the terminal
        polls = refresh_if_old(PriceBook(store), settings, [a.name for a in spec.accelerators])
    return [p.line for p in polls or []]
