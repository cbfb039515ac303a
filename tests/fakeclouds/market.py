"""A whole synthetic GPU market on the three clouds, served by the fake servers.

Used by the price-refresh benchmark and by ``python -m tests.fakeclouds.serve`` (a local stand-in
for the clouds to point ``broker prices --refresh`` at). Prices are made up but shaped like the
real ones: deterministic per offer, spot a fraction of on-demand.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from providers import aws as aws_provider
from providers import azure as azure_provider
from providers import catalog
from providers.gcp import ACCELERATORS as GCP_ACCELERATORS
from providers.gcp import SERIES as GCP_SERIES
from tests.fakeclouds.aws import FakeAws, price_list_product, spot_record
from tests.fakeclouds.azure import FakeAzure, resource_sku, retail_item
from tests.fakeclouds.gcp import FakeGcp, accelerator_type, machine_type, sku
from tests.fakeclouds.server import FakeServer

# On-demand USD per GPU-hour, roughly the clouds' list prices.
PER_GPU = {"H100": 12.29, "H200": 13.0, "B200": 14.0, "A100": 4.10, "A100-80GB": 5.12, "V100": 3.06,
           "V100-32GB": 3.90, "A10G": 1.006, "A10": 0.91, "L4": 0.805, "L40S": 1.86, "T4": 0.526}
GCP_ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-b", "us-east1-c",
             "us-east1-d", "us-east4-a", "us-east4-b", "us-east4-c", "us-west1-a", "us-west1-b", "us-west4-a",
             "us-west4-b", "europe-west4-a", "europe-west4-b", "europe-west4-c", "asia-northeast1-a",
             "asia-northeast1-c", "asia-southeast1-b", "asia-southeast1-c", "europe-west1-b")
OTHER_GCP_REGIONS = 40  # regions whose SKUs pad the catalog to a real size
OTHER_SKUS_PER_REGION = 600


def _unit(*parts: object) -> float:
    """A stable number in [0, 1) for an offer."""
    return zlib.crc32(repr(parts).encode()) / 2**32


def _spot_fraction(*parts: object) -> float:
    return 0.25 + 0.45 * _unit("spot", *parts)


# -- AWS ------------------------------------------------------------------------------------------

def aws_market(moto_url: str, regions: tuple[str, ...] = aws_provider.DEFAULT_REGIONS) -> FakeAws:
    from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
    from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS, INSTANCE_TYPES

    now = datetime.now(UTC).replace(microsecond=0)
    families = tuple(f"{f}." for f in aws_provider.GPU_FAMILIES)
    gpu_types = {name: info for name, info in INSTANCE_TYPES.items()
                 if name.startswith(families) or name in aws_provider.CPU_TYPES}
    history, scores, products = [], [], []
    for region in regions:
        zone_ids = {z.name: z.zone_id for z in RegionsAndZonesBackend.zones.get(region, [])}
        offered: dict[str, list[str]] = {}
        for offering in INSTANCE_TYPE_OFFERINGS["availability-zone"].get(region, []):
            if offering["InstanceType"] in gpu_types:
                offered.setdefault(offering["InstanceType"], []).append(offering["Location"])
        for name, zones in offered.items():
            on_demand = _aws_on_demand(name, gpu_types[name])
            gpus, family = (0, aws_provider.price_list_family(name)) if name in aws_provider.CPU_TYPES else \
                (1, "GPU instance")
            products.append(price_list_product(name, region, on_demand, gpus, family=family))
            products.append(price_list_product(name, region, on_demand * 1.4, gpus, operating_system="Windows",
                                               family=family))
            for zone in zones:
                if zone not in zone_ids:
                    continue
                for hours in (30, 6, 1):  # a few price changes, the newest in force
                    history.append(spot_record(name, zone, zone_ids[zone],
                                               round(on_demand * _spot_fraction(name, zone, hours), 4),
                                               now - timedelta(hours=hours)))
                scores.append({"InstanceType": name, "Region": region, "AvailabilityZoneId": zone_ids[zone],
                               "Score": 1 + int(9 * _unit("score", name, zone))})
    return FakeAws(moto_url, history, scores, products, page_size=1000)


def _aws_on_demand(name: str, info: dict[str, Any]) -> float:
    if name in aws_provider.CPU_TYPES:  # about what AWS asks: vCPUs, memory and the family's premium
        cpu = catalog.find_any(name, "aws")
        assert cpu is not None
        return round(cpu.vcpus * 0.034 + cpu.memory_gb * 0.0045 + 0.01 * _unit("cpu", name), 4)
    known = catalog.find("aws", name)
    if known is not None:
        gpus, accelerator, vcpus = known.gpus, known.accelerator, known.vcpus
    else:
        gpu = (info.get("GpuInfo") or {}).get("Gpus", [{}])[0]
        gpus, accelerator = int(gpu.get("Count", 1)), str(gpu.get("Name", "?"))
        vcpus = int(info.get("VCpuInfo", {}).get("DefaultVCpus", 8))
    return round(gpus * PER_GPU.get(accelerator, 2.0) + vcpus * 0.012, 4)


# -- GCP ------------------------------------------------------------------------------------------

# How the billing catalog words a GPU SKU where it is not "Nvidia <words>" (SkyPilot's fetch_gcp.py).
GCP_GPU_SKU = {"H200": "H200 141GB GPU", "B200": "A4 Nvidia B200 (1 gpu slice)"}


def gcp_market() -> FakeGcp:
    machines, accelerators, skus = [], [], []
    regions = sorted({z.rsplit("-", 1)[0] for z in GCP_ZONES})
    type_of = {label: name for name, (label, _, _) in GCP_ACCELERATORS.items()}  # H200 -> nvidia-h200-141gb
    for zone in GCP_ZONES:
        for entry in (*catalog.instance_types("gcp"), *catalog.cpu_instance_types("gcp")):
            if _unit("offered", entry.name, zone) > 0.7:
                continue
            bundled = not entry.attached and entry.gpus > 0
            machines.append(machine_type(entry.name, zone, entry.vcpus, int(entry.memory_gb * 1024),
                                         type_of[entry.accelerator] if bundled else None,
                                         entry.gpus if bundled else 0))
        for name in ("nvidia-tesla-v100", "nvidia-tesla-t4", "nvidia-l4", "nvidia-h100-80gb", "nvidia-tesla-a100"):
            if _unit("accelerator", name, zone) < 0.8:
                accelerators.append(accelerator_type(name, zone, 8))
    for region in regions:
        for name, (label, _, words) in GCP_ACCELERATORS.items():
            price = PER_GPU.get(label, 2.0)
            words = GCP_GPU_SKU.get(label, f"Nvidia {words}")
            skus.append(sku(f"{words} running in {region}", "GPU", "OnDemand", [region], price))
            skus.append(sku(f"{words} attached to Spot Preemptible VMs running in {region}", "GPU",
                            "Preemptible", [region], round(price * _spot_fraction(name, region), 6)))
            skus.append(sku(f"Commitment v1: {words} running in {region}", "GPU", "Commit1Yr", [region],
                            price * 0.63))
        for series, words in GCP_SERIES.items():
            core, ram = 0.031611 * (1.2 if series.startswith("a") else 1.0), 0.004237
            for usage, factor in (("OnDemand", 1.0), ("Preemptible", _spot_fraction(series, region))):
                prefix = "Spot Preemptible " if usage == "Preemptible" else ""
                skus.append(sku(f"{prefix}{words} Core running in {region}", "CPU", usage, [region],
                                round(core * factor, 6)))
                skus.append(sku(f"{prefix}{words} Ram running in {region}", "RAM", usage, [region],
                                round(ram * factor, 6), unit="GiBy.h"))
    for r in range(OTHER_GCP_REGIONS):
        region = f"region-{r:02d}"
        for i in range(OTHER_SKUS_PER_REGION):
            skus.append(sku(f"E2 Instance Core {i} running in {region}", "CPU", "OnDemand", [region], 0.02))
    return FakeGcp(skus, machines, accelerators, page_size=5000)


# -- Azure ----------------------------------------------------------------------------------------

def azure_market(regions: tuple[str, ...] = azure_provider.DEFAULT_REGIONS) -> FakeAzure:
    items, skus = [], []
    for region in regions:
        for size in (*catalog.instance_types("azure"), *catalog.cpu_instance_types("azure")):
            if _unit("azure", size.name, region) > 0.75:
                continue
            # a CPU-only size at Dsv5's list price per vCPU (Standard_D8s_v5: 0.384 USD/h in eastus)
            per_vcpu = 0.01 if size.gpus else 0.048
            on_demand = round(size.gpus * PER_GPU.get(size.accelerator, 2.0) * 0.85 + size.vcpus * per_vcpu, 4)
            spot = round(on_demand * _spot_fraction(size.name, region), 4)
            items += [
                retail_item(size.name, region, on_demand),
                retail_item(size.name, region, spot, variant="Spot"),
                retail_item(size.name, region, round(on_demand * 0.2, 4), variant="Low Priority"),
                retail_item(size.name, region, round(on_demand * 1.16, 4), windows=True),
                retail_item(size.name, region, round(spot * 1.3, 4), variant="Spot", windows=True),
                retail_item(size.name, region, round(on_demand * 0.62, 4), kind="Reservation"),
            ]
            zones = [z for z in ("1", "2", "3") if _unit("zone", size.name, region, z) < 0.8]
            skus.append(resource_sku(size.name, region, size.gpus, zones))
    return FakeAzure(items, skus, page_size=100)


# -- all three --------------------------------------------------------------------------------------

@dataclass
class FakeClouds:
    aws: FakeServer
    gcp: FakeServer
    azure: FakeServer

    def environment(self) -> dict[str, str]:
        """The environment that points ``broker prices`` at these servers."""
        return {
            "AWS_ENDPOINT_URL_EC2": self.aws.url, "AWS_ENDPOINT_URL_PRICING": self.aws.url,
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "BROKER_GCP_COMPUTE_ENDPOINT": self.gcp.url, "BROKER_GCP_BILLING_ENDPOINT": self.gcp.url,
            "BROKER_GCP_PROJECT": "demo-project", "BROKER_GCP_API_KEY": "demo-key",
            "BROKER_AZURE_PRICES_URL": f"{self.azure.url}/api/retail/prices",
            "BROKER_AZURE_RM_ENDPOINT": self.azure.url,
        }

    def requests(self) -> dict[str, int]:
        return {"aws": self.aws.total_requests, "gcp": self.gcp.total_requests, "azure": self.azure.total_requests}


def quiet_moto() -> None:
    """moto's server logs every request through werkzeug; only errors are worth a line."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)


@contextmanager
def fake_clouds(latency: float = 0.0) -> Iterator[FakeClouds]:
    from moto.server import ThreadedMotoServer

    quiet_moto()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    servers = FakeClouds(FakeServer(aws_market(f"http://{host}:{port}"), latency),
                         FakeServer(gcp_market(), latency), FakeServer(azure_market(), latency))
    for server in (servers.aws, servers.gcp, servers.azure):
        server.start()
    try:
        yield servers
    finally:
        for server in (servers.aws, servers.gcp, servers.azure):
            server.stop()
        moto.stop()
