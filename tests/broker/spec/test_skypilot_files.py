"""The broker's verdict on SkyPilot's own task files equals SkyPilot's (offline), file by file.

The files (Apache-2.0, see tests/broker/specs/skypilot/SOURCES.md) cover set and list syntax,
any_of, instance_type only, CPU-only, setup-only, fractions, pipelines and files SkyPilot refuses.
Two refusals are the broker's own, by design: TPUs (it places GPUs and CPUs only) and a task with
neither `run` nor `setup` (nothing to do). A fraction of a GPU per node of a gang is accepted, as
SkyPilot accepts it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from broker.spec.job import JobSpec, Pipeline, SpecError, parse_job_file

FILES = Path(__file__).resolve().parents[1] / "specs" / "skypilot"
BY_DESIGN = {
    "tpuvm_mnist.yaml": "the broker places GPUs and CPUs only",
    "autostop.yaml": "required: the command the job runs on each node",
}


def skypilot_accepts(text: str) -> bool:
    """SkyPilot's own loaders: a task via ``Task.from_yaml_config``, several documents via its DAG loader."""
    import sky
    from sky import sky_logging
    from sky.utils import dag_utils

    try:
        with sky_logging.silent():
            documents = list(yaml.safe_load_all(text))
            if len(documents) > 1:
                dag_utils.load_dag_from_yaml_str(text)
            else:
                sky.Task.from_yaml_config(copy.deepcopy(documents[0]) or {})
    except (ValueError, TypeError, KeyError, AssertionError):
        return False
    return True


def broker_verdict(name: str) -> JobSpec | Pipeline | SpecError:
    try:
        return parse_job_file((FILES / name).read_text(), source=name, offline=True)
    except SpecError as exc:
        return exc


NAMES = sorted(p.name for p in FILES.glob("*.yaml"))


def test_there_are_at_least_forty_files() -> None:
    assert len(NAMES) >= 40


@pytest.mark.parametrize("name", [n for n in NAMES if n not in BY_DESIGN])
def test_broker_agrees_with_skypilot(name: str) -> None:
    verdict = broker_verdict(name)
    accepted = not isinstance(verdict, SpecError)
    assert accepted == skypilot_accepts((FILES / name).read_text()), verdict
    if isinstance(verdict, SpecError):
        assert verdict.line is not None and verdict.field is not None and str(verdict).startswith(name)


@pytest.mark.parametrize("name", sorted(BY_DESIGN))
def test_broker_refuses_by_design_what_skypilot_accepts(name: str) -> None:
    assert skypilot_accepts((FILES / name).read_text())
    verdict = broker_verdict(name)
    assert isinstance(verdict, SpecError) and BY_DESIGN[name] in str(verdict)
    assert verdict.field in ("resources.accelerators", "run")


def test_a_fraction_per_node_of_a_gang_is_a_share_on_each_node() -> None:
    spec = broker_verdict("job_queue_job_multinode.yaml")
    assert isinstance(spec, JobSpec) and spec.num_nodes == 2 and spec.accelerators[0].fraction == 0.5


def test_set_syntax_is_alternatives_in_file_order() -> None:
    spec = broker_verdict("test_multiple_accelerators_unordered.yaml")
    assert isinstance(spec, JobSpec)
    assert [(a.name, a.count) for a in spec.accelerators] == [("A100", 1), ("T4", 1), ("V100", 1), ("K80", 1)]


def test_instance_type_without_accelerators_keeps_spot_placement_open() -> None:
    spec = broker_verdict("efa_vm.yaml")
    assert isinstance(spec, JobSpec) and spec.instance_type == "g6.8xlarge" and spec.num_nodes == 2


def test_setup_only_and_cpu_only_tasks_are_jobs() -> None:
    setup_only = broker_verdict("test_only_setup.yaml")
    assert isinstance(setup_only, JobSpec) and setup_only.run == "" and setup_only.setup
    cpu = broker_verdict("failed_worker_run.yaml")
    assert isinstance(cpu, JobSpec) and cpu.accelerators == () and cpu.cpus == "2+" and cpu.num_nodes == 3


def test_pipelines_parse_into_stages_with_their_own_resources() -> None:
    pipeline = broker_verdict("chain_dag_2_jobs.yaml")
    assert isinstance(pipeline, Pipeline) and pipeline.kind == "chain" and pipeline.name == "dag-name"
    assert [(s.name, s.cpus, s.memory) for s in pipeline.stages] == [("simple-1", "2+", "8+"),
                                                                      ("simple-2", "4+", "2+")]
