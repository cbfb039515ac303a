"""Generate the bundled market: every GPU and CPU-only type of the built-in catalog, six hours, one-minute ticks.

The quickstart's story is three V100 x1 zones on two clouds: the cheapest (AWS us-east-1a) loses
its spot capacity twenty minutes in (so the quickstart meets a preemption in its first half) and
gets it back 40 minutes later, when GCP us-central1-a is the next cheapest. Those rows come first
and do not change when the catalog grows.

Every other instance type of ``providers/catalog.py`` gets one zone on its cloud, priced from the
clouds' list prices (on-demand: per GPU plus the host's vCPUs; spot: a per-cloud discount with a
slow random walk, a row every quarter hour), with spot capacity throughout, so any task file
whose accelerator the catalog knows runs on the embedded default. The V100 x1 offers outside the
story are priced above it.

Run it again after the catalog changes:

    .venv/bin/python scripts/make_quickstart_trace.py > broker/data/quickstart-market.csv
"""

from __future__ import annotations

import csv
import sys
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from providers.catalog import CPU_INSTANCE_TYPES, GPU_INSTANCE_TYPES, InstanceType

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
TICKS = 360
# The quickstart story: (cloud, region, zone, instance type, spot list price, on-demand price) per node-hour, V100 x1.
ZONES = [
    ("aws", "us-east-1", "us-east-1a", "p3.2xlarge", 0.918, 3.06),
    ("aws", "us-west-2", "us-west-2b", "p3.2xlarge", 1.010, 3.06),
    ("gcp", "us-central1", "us-central1-a", "n1-highmem-8", 0.970, 2.95),
]
# Where the rest of the catalog is offered: one zone per cloud.
REGION = {"aws": ("us-east-1", "us-east-1b"), "gcp": ("us-central1", "us-central1-b"), "azure": ("eastus", "eastus-1")}
# On-demand USD per GPU-hour (the clouds' 2025-26 list prices, GPU share of the instance price).
PER_GPU = {
    "V100": 2.75, "V100-32GB": 3.65, "A100": 3.70, "A100-80GB": 4.60, "H100": 11.10,
    "A10G": 0.75, "L4": 0.62, "T4": 0.35, "A10": 0.85,
    # Added with the full catalog: scaled to H100 by the ratio of the instances' on-demand prices in
    # SkyPilot's catalog (AWS us-east-1: p5.48xlarge 55.04, p5en 63.30, p6-b200 113.93, p6-b300 142.42
    # USD/h), or the instance price less its vCPUs where one GPU type has no H100 counterpart.
    "H200": 12.76, "B200": 22.98, "B300": 28.72, "H100-MEGA": 11.10, "L40S": 2.05, "T4g": 0.23,
    "RTX PRO Server 6000": 2.98, "K80": 0.60, "M60": 0.84, "Radeon MI25": 0.26,
    # Azure's ND GB200 v6 and GB300 v6 (4 Blackwell GPUs on a Grace host) at the B200 and B300 GPU-hours; ND
    # MI300X v5 at about half the H100 GPU-hour, where the clouds and neoclouds that sell both price the MI300X.
    "GB200": 22.98, "GB300": 28.72, "MI300X": 6.00,
}
UNKNOWN_GPU = 2.0  # an accelerator added to the catalog before it is added here
PER_VCPU = {"aws": 0.048, "gcp": 0.047, "azure": 0.050}
SPOT_FRACTION = {"aws": 0.34, "gcp": 0.31, "azure": 0.38}
STORY_CEILING = 1.40  # other V100 x1 offers' spot price stays above every price of the story
OFFER_EVERY = 15  # ticks between the other offers' rows (a trace carries a quote forward until the next)


def on_demand_price(t: InstanceType) -> float:
    return round(t.gpus * PER_GPU.get(t.accelerator, UNKNOWN_GPU) + t.vcpus * PER_VCPU.get(t.cloud, 0.05), 4)


def spot_price(t: InstanceType) -> float:
    price = on_demand_price(t) * SPOT_FRACTION.get(t.cloud, 0.35)
    if t.accelerator == "V100" and t.gpus == 1:
        price = max(price, STORY_CEILING)
    return price


def catalog_offers() -> list[tuple[str, str, str, str, str, int, float, float]]:
    """(cloud, region, zone, instance type, accelerator, GPUs, spot list price, on-demand) for each catalog type."""
    story = {(cloud, itype) for cloud, _, _, itype, _, _ in ZONES}
    offers, seen = [], set()
    for t in (*GPU_INSTANCE_TYPES, *CPU_INSTANCE_TYPES):  # CPU-only types too: CPU tasks are jobs like any other
        if (t.cloud, t.name) in story or (t.cloud, t.name) in seen:
            continue  # GCP n1 types appear once per attachable GPU: the first one is the offer
        seen.add((t.cloud, t.name))
        region, zone = REGION.get(t.cloud, (f"{t.cloud}-region", f"{t.cloud}-zone"))
        offers.append((t.cloud, region, zone, t.name, t.accelerator, t.gpus, spot_price(t), on_demand_price(t)))
    return offers


def main() -> None:
    rng = np.random.default_rng(7)
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["time", "cloud", "region", "zone", "instance_type", "accelerator", "gpus_per_node",
                     "spot_price", "on_demand_price", "available_nodes"])
    walks = [np.cumsum(rng.normal(0, 0.004, TICKS)) for _ in ZONES]
    offers = catalog_offers()
    # Each offer's walk has its own seed (from its name), so adding a type to the catalog leaves the others alone.
    offer_walks = [np.cumsum(np.random.default_rng(zlib.crc32(f"{o[0]}/{o[3]}".encode())).normal(0, 0.004, TICKS))
                   for o in offers]
    for tick in range(TICKS):
        when = (START + timedelta(minutes=tick)).strftime("%Y-%m-%dT%H:%M:%SZ")
        for i, (cloud, region, zone, itype, spot, on_demand) in enumerate(ZONES):
            price = max(spot * 0.8, spot + walks[i][tick])
            available = 4
            if i == 0 and 20 <= tick < 60:
                available = 0
            if i == 1 and 200 <= tick < 230:
                available = 1
            writer.writerow([when, cloud, region, zone, itype, "V100", 1, f"{price:.4f}", f"{on_demand:.4f}",
                             available])
        if tick % OFFER_EVERY:
            continue
        for (cloud, region, zone, itype, accelerator, gpus, spot, on_demand), walk in zip(offers, offer_walks,
                                                                                           strict=True):
            price = max(spot * 0.8, spot * (1 + walk[tick]))
            writer.writerow([when, cloud, region, zone, itype, accelerator, gpus, f"{price:.4f}",
                             f"{on_demand:.4f}", 4])


if __name__ == "__main__":
    main()
