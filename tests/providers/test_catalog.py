"""The built-in catalog holds every GPU instance type of the SkyPilot excerpts it is generated from."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from providers import catalog

SOURCES = Path(__file__).resolve().parents[2] / "scripts" / "catalog_sources"


def excerpt_rows(cloud: str) -> list[dict[str, str]]:
    text = (SOURCES / f"skypilot_{cloud}_gpu_vms.csv").read_text()
    return list(csv.DictReader(io.StringIO("".join(line for line in text.splitlines(keepends=True)
                                                    if not line.startswith("#")))))


def whole_gpu_rows(cloud: str) -> list[dict[str, str]]:
    return [r for r in excerpt_rows(cloud) if r["AcceleratorName"] and float(r["AcceleratorCount"]).is_integer()]


@pytest.mark.parametrize("cloud", ["aws", "azure"])
def test_every_whole_gpu_type_of_the_excerpts_resolves_with_its_gpus(cloud: str) -> None:
    rows = whole_gpu_rows(cloud)
    assert len(rows) >= 30
    for row in rows:
        entry = catalog.find_any(row["InstanceType"])
        assert entry is not None, row["InstanceType"]
        assert (entry.cloud, entry.accelerator) == (cloud, row["AcceleratorName"])
        expected = 8 if row["InstanceType"] == "Standard_ND96isr_H100_v5" else int(float(row["AcceleratorCount"]))
        assert entry.gpus == expected, row["InstanceType"]
        assert entry.vcpus == int(float(row["vCPUs"])) and entry.memory_gb == float(row["MemoryGiB"])


def test_azure_h100_v5_count_is_the_clouds_not_skypilots() -> None:
    # SkyPilot's Azure file says 12 GPUs for this size; Azure's size page says 8 H100.
    [row] = [r for r in excerpt_rows("azure") if r["InstanceType"] == "Standard_ND96isr_H100_v5"]
    assert row["AcceleratorCount"] == "12"
    nd = catalog.find("azure", "Standard_ND96isr_H100_v5")
    assert nd is not None and (nd.gpus, nd.interconnect) == (8, "nvswitch")


def test_every_gcp_gpu_machine_of_the_excerpt_resolves_from_skypilots_table() -> None:
    from sky.catalog import gcp_catalog

    table = {name: (acc, count) for acc, by_count in gcp_catalog._ACC_INSTANCE_TYPE_DICTS.items()
             for count, names in by_count.items() for name in names}
    machines = [r["InstanceType"] for r in excerpt_rows("gcp") if r["InstanceType"].startswith(("a2-", "a3-", "a4-"))]
    assert len(machines) == 19
    for name in machines:
        entry = catalog.find("gcp", name)
        assert entry is not None, name
        if name in table:
            assert (entry.accelerator, entry.gpus) == table[name]


def test_fractional_gpu_types_are_not_whole_gpu_offers() -> None:
    fractional = [r["InstanceType"] for r in excerpt_rows("aws") if not float(r["AcceleratorCount"]).is_integer()]
    assert fractional == ["g6f.2xlarge", "g6f.4xlarge", "g6f.large", "g6f.xlarge"]
    assert all(catalog.find_any(name) is None for name in fractional)


@pytest.mark.parametrize(("name", "accelerator", "gpus", "gb", "link"), [
    ("p5en.48xlarge", "H200", 8, 141, "nvswitch"),
    ("p5e.48xlarge", "H200", 8, 141, "nvswitch"),
    ("a3-ultragpu-8g", "H200", 8, 141, "nvswitch"),
    ("p6-b200.48xlarge", "B200", 8, 180, "nvswitch"),
    ("a4-highgpu-8g", "B200", 8, 180, "nvswitch"),
    ("g6e.xlarge", "L40S", 1, 48, "none"),
    ("g6e.48xlarge", "L40S", 8, 48, "pcie"),
    ("g5.48xlarge", "A10G", 8, 24, "pcie"),
    ("a3-highgpu-1g", "H100", 1, 80, "none"),
    ("a3-megagpu-8g", "H100-MEGA", 8, 80, "nvswitch"),
    ("p3.16xlarge", "V100", 8, 16, "nvlink"),
    ("p3dn.24xlarge", "V100-32GB", 8, 32, "nvlink"),
    ("p4d.24xlarge", "A100", 8, 40, "nvswitch"),
    ("Standard_NC80adis_H100_v5", "H100", 2, 80, "nvlink"),
    ("Standard_NC64as_T4_v3", "T4", 4, 16, "pcie"),
    ("Standard_ND96isr_H200_v5", "H200", 8, 141, "nvswitch"),
    ("Standard_ND96isr_MI300X_v5", "MI300X", 8, 192, "nvswitch"),
    ("Standard_ND128isr_NDR_GB200_v6", "GB200", 4, 192, "nvswitch"),
    ("Standard_ND128isr_GB300_v6", "GB300", 4, 288, "nvswitch"),
])
def test_gpu_memory_and_interconnect_of_the_new_models(name: str, accelerator: str, gpus: int, gb: float,
                                                       link: str) -> None:
    entry = catalog.find_any(name)
    assert entry is not None
    assert (entry.accelerator, entry.gpus, entry.gpu_memory_gb, entry.interconnect) == (accelerator, gpus, gb, link)


def test_cpu_only_types_fit_cpus_and_memory_smallest_first() -> None:
    fits = catalog.cpu_instance_types(cloud="aws", min_cpus=8, min_memory_gb=32)
    assert fits and all(t.vcpus >= 8 and t.memory_gb >= 32 and t.gpus == 0 for t in fits)
    assert (fits[0].vcpus, fits[0].memory_gb) == (8, 32)
    assert catalog.find_any("m5.2xlarge") == fits[[t.name for t in fits].index("m5.2xlarge")]
    assert catalog.find_any("t3.small") is not None and catalog.find_any("t3.small").interconnect == ""  # type: ignore[union-attr]


def vendor_rows() -> list[dict[str, str]]:
    text = (SOURCES / "msdocs_azure_vms.csv").read_text()
    return list(csv.DictReader(io.StringIO("".join(line for line in text.splitlines(keepends=True)
                                                    if not line.startswith("#")))))


def test_every_azure_size_of_the_microsoft_learn_excerpt_resolves_with_its_shape() -> None:
    rows = vendor_rows()
    assert len(rows) == 39
    for row in rows:
        entry = catalog.find_any(row["InstanceType"], "azure")
        assert entry is not None, row["InstanceType"]
        assert entry.accelerator == row["AcceleratorName"]
        assert entry.gpus == int(row["AcceleratorCount"] or 0)
        assert (entry.vcpus, entry.memory_gb) == (int(row["vCPUs"]), float(row["MemoryGiB"]))
        assert row["Source"].startswith("msdocs:")


def test_azure_cpu_only_sizes_fit_cpus_and_memory() -> None:
    fits = catalog.cpu_instance_types(cloud="azure", min_cpus=8, min_memory_gb=32)
    assert [(t.vcpus, t.memory_gb) for t in fits[:3]] == [(8, 32), (8, 32), (8, 64)]
    assert {t.name for t in fits[:2]} == {"Standard_D8s_v5", "Standard_D8as_v5"}
    assert all(t.gpus == 0 and t.interconnect == "" for t in fits)
    assert {t.name[:10] for t in catalog.cpu_instance_types(cloud="azure")} >= {"Standard_D", "Standard_E",
                                                                                 "Standard_F"}


@pytest.mark.parametrize(("name", "cloud", "spelt"), [
    ("p4d.24xlarge", "aws", True), ("g5.metal", "aws", True), ("p4d", "aws", False),
    ("a2-highgpu-1g", "gcp", True), ("e2-small", "gcp", True), ("a2_highgpu", "gcp", False),
    ("Standard_NC24ads_A100_v4", "azure", True), ("NC24ads", "azure", False),
    ("p4d.24xlarge", "local", False), ("p4d.24xlarge", "gcp", False),
])
def test_each_clouds_spelling_of_instance_types(name: str, cloud: str, spelt: bool) -> None:
    assert catalog.spelt_as_instance_type(name, cloud) is spelt
