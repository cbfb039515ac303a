"""``resources.cloud`` limits where a job runs, as ``broker.clouds`` does (SkyPilot places a task only there)."""

from __future__ import annotations

import pytest

from broker.spec import SpecError, parse_job_spec


def clouds_of(resources: str, broker: str = "") -> frozenset[str]:
    text = f"run: x\nresources:\n{resources}" + (f"broker:\n{broker}" if broker else "")
    return parse_job_spec(text, source="job.yaml", offline=True).allowed_clouds


def test_a_named_cloud_is_the_only_one_allowed() -> None:
    assert clouds_of("  cloud: gcp\n  accelerators: A100:8\n") == {"gcp"}


def test_every_alternative_naming_a_cloud_allows_those_clouds() -> None:
    resources = ("  any_of:\n    - {cloud: aws, accelerators: A100:8}\n"
                 "    - {cloud: gcp, accelerators: A100:8}\n")
    assert clouds_of(resources) == {"aws", "gcp"}


def test_an_alternative_without_a_cloud_leaves_every_cloud_open() -> None:
    resources = "  any_of:\n    - {cloud: aws, accelerators: A100:8}\n    - {accelerators: H100:8}\n"
    assert clouds_of(resources) == frozenset()


def test_broker_clouds_are_narrowed_by_resources() -> None:
    assert clouds_of("  cloud: aws\n  accelerators: V100:1\n", "  clouds: [aws, gcp]\n") == {"aws"}
    assert clouds_of("  accelerators: V100:1\n", "  clouds: [aws, gcp]\n") == {"aws", "gcp"}


def test_resources_and_broker_clouds_that_share_no_cloud_are_refused_naming_the_line() -> None:
    text = "run: x\nresources:\n  cloud: azure\n  accelerators: V100:1\nbroker:\n  clouds: [aws]\n"
    with pytest.raises(SpecError) as caught:
        parse_job_spec(text, source="job.yaml", offline=True)
    assert (caught.value.field, caught.value.line) == ("resources.cloud", 3)
    assert "the job could run nowhere" in str(caught.value)
