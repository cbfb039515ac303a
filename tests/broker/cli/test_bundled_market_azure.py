"""Azure's newer sizes run on the embedded default: a task file asking for H200:8 on Azure, or for CPUs only
on Azure, is accepted offline (judged against Azure's built-in catalog) and the selection policy places
it on the bundled market's Azure offer: ``resources.cloud`` limits placement as ``broker.clouds`` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli.sky_dryrun import preview_plan
from broker.engine.feasibility import never_held
from broker.spec.job import parse_job_spec
from policies.selection import IDLE
from providers.trace import read_trace

BUNDLED = Path(__file__).resolve().parents[3] / "broker" / "data" / "quickstart-market.csv"


def _placed(task: str) -> tuple[str, str, str, int]:
    spec = parse_job_spec(task, source="task.yaml", offline=True)
    trace = read_trace(BUNDLED)
    offered = {(z.accelerator, z.gpus_per_node) for z in trace.zones}
    assert never_held(spec, offered, None) is None
    plan = preview_plan(spec, trace.quotes_at(0), None)
    [first] = [loc.offer for loc in plan.locations[:1] if loc.kind != IDLE and loc.offer is not None]
    return first.cloud, first.zone, first.instance_type, first.gpus_per_node


@pytest.mark.parametrize(("accelerators", "instance_type"), [
    ("H200:8", "Standard_ND96isr_H200_v5"),
    ("MI300X:8", "Standard_ND96isr_MI300X_v5"),
    ("GB200:4", "Standard_ND128isr_NDR_GB200_v6"),
    ("GB300:4", "Standard_ND128isr_GB300_v6"),
])
def test_an_azure_gpu_task_of_the_new_sizes_is_placed_on_the_bundled_market(accelerators: str,
                                                                            instance_type: str) -> None:
    task = f"name: big\nresources:\n  cloud: azure\n  accelerators: {accelerators}\nrun: python train.py\n"
    gpus = int(accelerators.split(":")[1])
    assert _placed(task) == ("azure", "eastus-1", instance_type, gpus)


def test_a_cpu_only_azure_task_is_placed_on_a_fitting_azure_size() -> None:
    from providers.catalog import find_any

    task = "name: etl\nresources:\n  cloud: azure\n  cpus: 8+\n  memory: 32+\nrun: python etl.py\n"
    cloud, zone, instance_type, gpus = _placed(task)
    size = find_any(instance_type, "azure")
    assert (cloud, zone, gpus) == ("azure", "eastus-1", 0)
    assert size is not None and size.vcpus >= 8 and size.memory_gb >= 32 and size.gpus == 0


def test_h200_on_azure_comes_eight_to_a_node_offline() -> None:
    spec = parse_job_spec("resources:\n  cloud: azure\n  accelerators: H200:8\nrun: x\n", offline=True)
    assert (spec.accelerator, spec.gpus_per_node) == ("H200", 8)
    with pytest.raises(Exception, match="H200:3 is not offered on azure: a node has 8 H200"):
        parse_job_spec("resources:\n  cloud: azure\n  accelerators: H200:3\nrun: x\n", source="t.yaml",
                       offline=True)
