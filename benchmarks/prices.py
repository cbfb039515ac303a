"""Full refresh of every GPU and CPU-only offer on the three clouds, against local servers adding latency.

    python benchmarks/prices.py [--latency 0.1] [--no-baseline]

The fake clouds serve a whole market shaped like the real one (moto's EC2 catalog and offerings in
six AWS regions, a 24k-SKU GCP billing catalog over 22 zones, Azure's GPU sizes in ten regions);
every request waits ``--latency`` seconds first. The refresh polls and records into a SQLite price
book, as `broker prices --refresh` does. Prints seconds and requests per cloud against the 30 s
target, a refresh of GPU types only (what CPU-only offers cost) and a sequential refresh (one
region, one cloud at a time), measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_SECONDS = 30.0


class StaticToken:
    """Stands in for Entra ID so the refresh includes Azure's resource SKUs."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("benchmark-token", int(time.time()) + 3600)


def sources(env: dict[str, str], workers: int, cpu_types: bool = True, capacity: bool = True,
            shared: dict[str, Any] | None = None) -> dict[str, Any]:
    """``shared``: the capacity throttles and answer caches of a process that refreshes again (None: new ones)."""
    from google.auth.credentials import AnonymousCredentials

    from providers.aws import AwsPriceSource
    from providers.azure import AzurePriceSource
    from providers.gcp import GcpPriceSource

    return {
        "aws": AwsPriceSource(ec2_endpoint=env["AWS_ENDPOINT_URL_EC2"],
                              pricing_endpoint=env["AWS_ENDPOINT_URL_PRICING"], max_workers=workers,
                              cpu_types=cpu_types, placement_scores=capacity),
        "gcp": GcpPriceSource(project="benchmark", compute_endpoint=env["BROKER_GCP_COMPUTE_ENDPOINT"],
                              billing_endpoint=env["BROKER_GCP_BILLING_ENDPOINT"], api_key="benchmark",
                              credentials=AnonymousCredentials(), cpu_types=cpu_types, capacity_advice=capacity,
                              advice_state=(shared or {}).get("gcp"), capacity_history=capacity,
                              history_cache=(shared or {}).get("gcp-history")),
        "azure": AzurePriceSource(prices_url=env["BROKER_AZURE_PRICES_URL"],
                                  rm_endpoint=env["BROKER_AZURE_RM_ENDPOINT"],
                                  subscription_id="00000000-0000-0000-0000-000000000000", credential=StaticToken(),
                                  max_workers=workers, cpu_types=cpu_types, placement_scores=capacity,
                                  placement_state=(shared or {}).get("azure")),
    }


def refresh(book: Any, clouds: Any, concurrent: bool, cpu_types: bool = True, capacity: bool = True,
            shared: dict[str, Any] | None = None) -> tuple[float, list[Any], dict[str, int]]:
    from broker.market.polling import poll_prices

    before = clouds.requests()
    started = time.perf_counter()
    if concurrent:
        polls = poll_prices(book, sources(clouds.environment(), workers=16, cpu_types=cpu_types, capacity=capacity,
                                          shared=shared))
    else:
        polls = [p for name, source in sources(clouds.environment(), workers=1).items()
                 for p in poll_prices(book, {name: source})]
    seconds = time.perf_counter() - started
    after = clouds.requests()
    return seconds, polls, {c: after[c] - before[c] for c in after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds added to every request (default 0.1)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the sequential refresh")
    args = parser.parse_args()

    from broker.market.book import PriceBook
    from broker.store import open_store
    from tests.fakeclouds.market import fake_clouds

    with tempfile.TemporaryDirectory() as tmp, fake_clouds(args.latency) as clouds:
        os.environ.update(clouds.environment())  # the test keys boto3 signs with
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
        store = open_store(f"sqlite:///{Path(tmp) / 'book.db'}")
        book = PriceBook(store)
        from providers.capacity import Throttle, TtlCache

        # GCP's capacityHistory changes daily: a process keeps it for hours (providers.sources), so
        # the first refresh asks it and the next ones, as a running service's, do not.
        process = {"gcp-history": TtlCache(6 * 3600.0)}
        cold, polls, requests = refresh(book, clouds, concurrent=True, shared=process)
        failed = [p.line for p in polls if p.status != "ok"]
        if failed:
            sys.exit("refresh failed: " + "; ".join(failed))
        warm, polls, warm_requests = refresh(book, clouds, concurrent=True, shared=process)
        print(f"Prices refresh: every GPU and CPU-only offer on three clouds, {args.latency * 1000:.0f} ms added "
              "per request")
        print(f"{'cloud':<6} {'quotes':>7} {'requests':>9} {'seconds':>8}")
        for p in polls:
            print(f"{p.cloud:<6} {p.quotes:>7} {warm_requests[p.cloud]:>9} {p.seconds:>8.2f}")
        total_requests = sum(warm_requests.values())
        print(f"{'all':<6} {sum(p.quotes for p in polls):>7} {total_requests:>9} {warm:>8.2f}")
        print(f"full refresh, first in the process (SDK imports and GCP's capacityHistory included): {cold:.2f} s "
              f"({sum(requests.values())} requests: gcp {requests['gcp']})")
        print(f"full refresh, warm: {warm:.2f} s = {warm / TARGET_SECONDS:.2f} x the {TARGET_SECONDS:.0f} s target")
        shared: dict[str, Any] = {cloud: (Throttle(0.05), TtlCache(600.0)) for cloud in ("gcp", "azure")}
        shared["gcp-history"] = process["gcp-history"]
        refresh(book, clouds, concurrent=True, shared=shared)  # fills the process's capacity caches
        cached, _, cached_requests = refresh(book, clouds, concurrent=True, shared=shared)
        print(f"full refresh again within capacity_cache_seconds (capacity answers cached): {cached:.2f} s "
              f"({sum(cached_requests.values())} requests: gcp {cached_requests['gcp']}, "
              f"azure {cached_requests['azure']})")
        bare, _, bare_requests = refresh(book, clouds, concurrent=True, capacity=False)
        print(f"without capacity signals (no AWS placement scores, GCP advice.capacity and capacityHistory, "
              f"Azure placement scores): "
              f"{bare:.2f} s ({sum(bare_requests.values())} requests: aws {bare_requests['aws']}, "
              f"gcp {bare_requests['gcp']}, azure {bare_requests['azure']})")
        gpu_only, gpu_polls, gpu_requests = refresh(book, clouds, concurrent=True, cpu_types=False, shared=process)
        print(f"GPU types only (the catalog's CPU-only types left out): {gpu_only:.2f} s, "
              f"{sum(p.quotes for p in gpu_polls)} quotes, {sum(gpu_requests.values())} requests "
              f"(aws {gpu_requests['aws']}, gcp {gpu_requests['gcp']}, azure {gpu_requests['azure']})")
        if not args.no_baseline:
            sequential, _, seq_requests = refresh(book, clouds, concurrent=False)
            print(f"sequential baseline (one region, one cloud at a time): {sequential:.2f} s "
                  f"({sum(seq_requests.values())} requests); concurrent refresh is {sequential / warm:.1f}x faster")
        store.dispose()


if __name__ == "__main__":
    main()
