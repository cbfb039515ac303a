"""Generate the bundled quickstart market: three zones on two clouds, six hours, one-minute ticks.

Prices follow each zone's list price with a slow random walk; the cheapest zone loses its spot
capacity twenty minutes in (so the quickstart meets a preemption in its first half) and gets
it back 40 minutes later. Run: ``python scripts/make_quickstart_trace.py > broker/data/quickstart-market.csv``.
"""

from __future__ import annotations

import csv
import sys
from datetime import UTC, datetime, timedelta

import numpy as np

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
TICKS = 360
# (cloud, region, zone, instance type, spot list price, on-demand price) per node-hour, V100 x1.
ZONES = [
    ("aws", "us-east-1", "us-east-1a", "p3.2xlarge", 0.918, 3.06),
    ("aws", "us-west-2", "us-west-2b", "p3.2xlarge", 1.010, 3.06),
    ("gcp", "us-central1", "us-central1-a", "n1-highmem-8", 0.970, 2.95),
]


def main() -> None:
    rng = np.random.default_rng(7)
    writer = csv.writer(sys.stdout)
    writer.writerow(["time", "cloud", "region", "zone", "instance_type", "accelerator", "gpus_per_node",
                     "spot_price", "on_demand_price", "available_nodes"])
    walks = [np.cumsum(rng.normal(0, 0.004, TICKS)) for _ in ZONES]
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


if __name__ == "__main__":
    main()
