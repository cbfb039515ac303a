"""``broker launch --backend skypilot`` before the engine starts: the job judged against what the
clouds quote, and the price book refreshed when its quotes for the job are old.

Any GPU instance type the price book has a quote for is accepted, whether or not the built-in or
SkyPilot's catalog knows it; a job the book does not offer is judged by the catalogs as before.
"""

from __future__ import annotations

from pathlib import Path

from broker.config.settings import Settings
from broker.market.book import PriceBook
from broker.spec.job import JobSpec, Pipeline, SpecError, load_job_file, load_job_spec, market_offers
from broker.store import Store


def read_job(job_file: Path, book: PriceBook) -> JobSpec | Pipeline:
    """The job file, accepted when the price book offers what it asks for, else by the catalogs
    (a pipeline's stages always by the catalogs)."""
    quotes = book.latest()
    if quotes:
        try:
            return load_job_spec(job_file, market=market_offers(quotes))
        except SpecError:
            pass  # not an offer the book has seen: the catalogs judge it (and word the refusal)
    return load_job_file(job_file)


def refresh_prices(store: Store, settings: Settings, spec: JobSpec) -> list[str]:
    """Poll the clouds when the newest quote for the job's accelerators is older than
    ``price_max_age_seconds``; one line per cloud polled (none when the book was fresh)."""
    from broker.cli.sky_output import captured
    from broker.market.polling import refresh_if_old

    with captured():  # the cloud SDKs' own chatter (credential probes) stays off the terminal
        polls = refresh_if_old(PriceBook(store), settings, [a.name for a in spec.accelerators])
    return [p.line for p in polls or []]
