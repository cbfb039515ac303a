"""``resources.cloud`` limits where a job runs, as ``broker.clouds`` does (SkyPilot places a task only there)."""

from __future__ import annotations

import pytest

from broker.spec.job import SpecError, parse_job_spec


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


def places_of(resources: str, broker: str = "") -> frozenset[tuple[str, str | None]]:
    text = f"run: x\nresources:\n{resources}" + (f"broker:\n{broker}" if broker else "")
    return parse_job_spec(text, source="job.yaml", offline=True).allowed_regions


def test_a_named_region_pins_the_job_to_it() -> None:
    assert places_of("  cloud: aws\n  region: us-west-2\n  accelerators: V100:1\n") == {("aws", "us-west-2")}
    assert places_of("  infra: gcp/us-central1\n  accelerators: A100:8\n") == {("gcp", "us-central1")}


def test_a_region_in_broker_clouds_narrows_a_cloud_in_resources() -> None:
    assert places_of("  cloud: aws\n  accelerators: V100:1\n",
                     "  clouds: [aws/us-east-1, gcp]\n") == {("aws", "us-east-1")}


def test_a_cloud_the_broker_does_not_place_on_leaves_the_job_unpinned() -> None:
    assert places_of("  cloud: kubernetes\n  accelerators: A100:8\n") == frozenset()


def test_regions_that_differ_are_refused() -> None:
    text = ("run: x\nresources:\n  cloud: aws\n  region: us-west-2\n  accelerators: V100:1\n"
            "broker:\n  clouds: [aws/us-east-1]\n")
    with pytest.raises(SpecError, match=r"aws/us-west-2 but broker\.clouds allows only aws/us-east-1"):
        parse_job_spec(text, source="job.yaml", offline=True)
