"""A job judged against the market it will run on (``broker simulate``, ``--market``), not a catalog."""

from __future__ import annotations

import pytest

from broker.spec.job import SpecError, market_offers, parse_job_spec
from providers.trace import parse_trace

HEADER = "time,cloud,region,zone,instance_type,accelerator,gpus_per_node,spot_price,on_demand_price,available_nodes"


def trace(*rows: str) -> tuple:
    return market_offers(parse_trace([HEADER, *rows]).zones)


GCP_H100 = trace("2025-01-01T00:00:00Z,gcp,us-central1,us-central1-a,a3-highgpu-1g,H100,1,2.5,11.0,16")


def test_a_gang_the_trace_offers_is_accepted() -> None:
    text = "run: x\nnum_nodes: 16\nresources:\n  accelerators: H100:1\n"
    spec = parse_job_spec(text, source="job.yaml", market=GCP_H100)
    assert (spec.num_nodes, spec.accelerators[0].name, spec.accelerators[0].count) == (16, "H100", 1)


def test_a_name_only_the_trace_knows_is_accepted() -> None:
    offers = trace("2025-01-01T00:00:00Z,aws,us-east-1,us-east-1a,p6-b300.48xlarge,B300,8,30,90,1")
    spec = parse_job_spec("run: x\nresources:\n  accelerators: B300:8\n", source="job.yaml", market=offers)
    assert spec.accelerators[0].name == "B300"


def test_what_the_trace_lacks_is_refused_naming_what_it_has() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job_spec("run: x\nresources:\n  accelerators: H100:8\n", source="job.yaml", market=GCP_H100)
    assert (caught.value.field, caught.value.line) == ("resources.accelerators", 3)
    assert "the market has no rows for accelerators H100:8; it has H100:1 (a3-highgpu-1g)" in str(caught.value)


def test_a_cpu_task_needs_no_gpu_offer() -> None:
    assert parse_job_spec("run: x\nresources:\n  cpus: 4+\n", source="job.yaml", market=GCP_H100).accelerators == ()
