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


@pytest.mark.parametrize("resources", [
    "accelerators: A100:2\n  instance_type: a2-highgpu-2g",
    "accelerators: A100:0.5\n  instance_type: a2-highgpu-2g",  # a share of one of its GPUs
    "accelerators: a100:8\n  instance_type: p4d.24xlarge",
    "accelerators: {H100: 8}\n  instance_type: Standard_ND96isr_H100_v5",
    "accelerators: V100:2\n  instance_type: n1-highmem-8",  # GCP n1 takes GPUs attached to it
])
def test_instance_type_carrying_the_accelerators_is_kept_and_ties_them(resources: str) -> None:
    spec = parse(f"run: x\nresources:\n  {resources}\n")
    assert spec.accelerators and all(a.instance_types == (spec.instance_type,) for a in spec.accelerators)


@pytest.mark.parametrize(("resources", "carries"), [
    ("accelerators: A100:1\n  instance_type: a2-highgpu-2g", "A100:2"),
    ("accelerators: H100:8\n  instance_type: p4d.24xlarge", "A100:8"),
    ("accelerators: T4:1\n  instance_type: m5.2xlarge", "no GPUs"),
    ("accelerators: [H100:8, H200:8]\n  instance_type: p5en.48xlarge\n  infra: aws", None),
])
def test_instance_type_without_the_accelerators_is_refused_naming_it(resources: str, carries: str | None) -> None:
    text = f"run: x\nresources:\n  {resources}\n"
    if carries is None:  # one of the listed choices is what the type carries: kept
        assert parse(text).accelerators[-1].name == "H200"
        return
    with pytest.raises(SpecError) as caught:
        parse(text)
    error = caught.value
    assert (error.field, error.line) == ("resources.instance_type", 4)
    assert f"carries {carries} per node" in str(error) and "\n" not in str(error)


def test_a_disagreeing_alternative_is_refused_where_it_sits() -> None:
    text = ("run: x\nresources:\n  any_of:\n    - {accelerators: H100:1}\n"
            "    - accelerators: A100:1\n      instance_type: a2-highgpu-2g\n")
    with pytest.raises(SpecError) as caught:
        parse(text)
    assert (caught.value.field, caught.value.line) == ("resources.any_of[1].instance_type", 6)
