"""Job files naming the newest GPUs and instance types validate offline, against the built-in catalog."""

from __future__ import annotations

from typing import Any

import pytest

from broker.spec.job import AcceleratorChoice, JobSpec, SpecError, parse_job_spec


@pytest.fixture(scope="module", autouse=True)
def sky_imported() -> None:
    """SkyPilot takes seconds to import: pay once per module rather than inside the first test."""
    import sky  # noqa: F401


def parse(text: str, **kwargs: Any) -> JobSpec:
    return parse_job_spec(text, source="job.yaml", offline=True, **kwargs)


@pytest.mark.parametrize(("resources", "accelerators"), [
    ("accelerators: H200:8", ("H200", 8)),
    ("accelerators: B200:8", ("B200", 8)),
    ("accelerators: L40S:1", ("L40S", 1)),
    ("accelerators: h200:8\n  infra: gcp", ("H200", 8)),
    ("accelerators: B200:8\n  infra: gcp", ("B200", 8)),
    ("accelerators: H100:1\n  infra: gcp", ("H100", 1)),
    ("accelerators: H100:2\n  infra: gcp", ("H100", 2)),
    ("accelerators: A100-40GB:8", ("A100", 8)),
    ("accelerators: T4:1\n  infra: aws", ("T4", 1)),
    ("accelerators: L4:1\n  infra: aws", ("L4", 1)),
    ("instance_type: p5en.48xlarge", ("H200", 8)),
    ("instance_type: p6-b200.48xlarge", ("B200", 8)),
    ("instance_type: g6e.12xlarge", ("L40S", 4)),
    ("instance_type: g6.8xlarge", ("L4", 1)),
    ("instance_type: a3-highgpu-1g", ("H100", 1)),
    ("instance_type: a3-ultragpu-8g", ("H200", 8)),
    ("instance_type: Standard_ND96isr_H100_v5", ("H100", 8)),
])
def test_new_gpus_validate_offline(resources: str, accelerators: tuple[str, int]) -> None:
    spec = parse(f"run: x\nresources:\n  {resources}\n")
    assert spec.accelerators == (AcceleratorChoice(*accelerators),)


@pytest.mark.parametrize("instance_type", ["m5.2xlarge", "t3.small", "c2-standard-16"])
def test_cpu_only_instance_types_validate_offline(instance_type: str) -> None:
    spec = parse(f"run: x\nresources:\n  instance_type: {instance_type}\n  cpus: 2+\n")
    assert (spec.accelerators, spec.instance_type) == ((), instance_type)


def test_a_gpu_a_cloud_does_not_sell_is_refused_on_that_cloud() -> None:
    # Azure sells no L4 size: asking Azure for one names the field and line.
    with pytest.raises(SpecError) as caught:
        parse("run: x\nresources:\n  infra: azure\n  accelerators: L4:1\n")
    assert (caught.value.field, caught.value.line) == ("resources.accelerators", 4)
    assert "L4" in str(caught.value) and "azure" in str(caught.value)


@pytest.mark.parametrize("name", ["tpu-v5p-8", "tpu-v4-8", "Inferentia:1", "Trainium:16"])
def test_tpus_inferentia_and_trainium_are_refused_with_the_reason(name: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse(f"run: x\nresources:\n  accelerators: {name}\n")
    assert "the broker places GPUs and CPUs only" in str(caught.value)
    assert (caught.value.field, caught.value.line) == ("resources.accelerators", 3)
