"""A task without accelerators is a job like any other: it goes to a node without GPUs that has the
vCPUs and memory it asks for (by the built-in catalog's shape of each instance type)."""

from __future__ import annotations

from datetime import UTC, datetime

from broker.engine.planning import fitting
from broker.spec.job import parse_job_spec
from providers.base import SpotQuote

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _quote(instance_type: str, accelerator: str = "", gpus: int = 0, spot: float = 0.1) -> SpotQuote:
    return SpotQuote("aws", "us-east-1", "us-east-1a", instance_type, accelerator, gpus, spot, spot * 3, T0)


MARKET = [
    _quote("g5g.xlarge", "T4g", 1, spot=0.05),  # the cheapest node of all carries a GPU the task would idle
    _quote("m5.large", spot=0.03),  # 2 vCPUs, 8 GiB
    _quote("m5.2xlarge", spot=0.13),  # 8 vCPUs, 32 GiB
    _quote("r5.2xlarge", spot=0.16),  # 8 vCPUs, 64 GiB
    _quote("x9.unknown", spot=0.01),  # no shape in the catalog
]


def _names(text: str) -> list[str]:
    spec = parse_job_spec(text, source="cpu.yaml", offline=True)
    offers, _ = fitting(spec, MARKET)
    return sorted(q.instance_type for q in offers)


def test_a_cpu_task_fits_only_nodes_without_gpus_with_its_cpus_and_memory() -> None:
    assert _names("resources:\n  cpus: 8+\n  memory: 32+\nrun: make\n") == ["m5.2xlarge", "r5.2xlarge"]
    assert _names("resources:\n  memory: 64+\nrun: make\n") == ["r5.2xlarge"]


def test_a_cpu_task_without_minimums_takes_any_node_without_gpus() -> None:
    assert _names("run: make\n") == ["m5.2xlarge", "m5.large", "r5.2xlarge", "x9.unknown"]


def test_a_cpu_task_naming_its_instance_type_gets_that_type() -> None:
    assert _names("resources:\n  instance_type: r5.2xlarge\nrun: make\n") == ["r5.2xlarge"]


def test_a_gpu_task_never_gets_a_node_without_its_gpus() -> None:
    assert _names("resources:\n  accelerators: T4g:1\nrun: train\n") == ["g5g.xlarge"]
