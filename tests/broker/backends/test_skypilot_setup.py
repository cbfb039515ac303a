"""A job's setup on SkyPilot: run ahead as an ``exec`` beside the running gang, or first in the run's
``exec`` when the cluster was launched with another job's setup; SkyPilot played by the stand-in."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from broker.backends.base import ClusterInfo, ClusterPhase, JobLaunch, RunPhase
from broker.backends.skypilot.provisioner import SkyPilotOptions, SkyPilotProvisioner
from broker.spec.job import JobSpec, parse_job_spec
from policies.gang import GangPlacement
from tests.skystandin.server import SkyStandIn

JOB = """\
name: {name}
num_nodes: 2
resources:
  accelerators: V100:1
setup: {setup}
run: python train.py
"""
CLUSTER = ClusterInfo("j-a-c1", "aws", "us-east-1", "us-east-1a", "p3.2xlarge", 2, 1, True)


def _spec(name: str, setup: str) -> JobSpec:
    return parse_job_spec(JOB.format(name=name, setup=setup), offline=True)


def _launch(spec: JobSpec, job_id: str, setup_done: bool = False) -> JobLaunch:
    return JobLaunch(job_id, 1, spec, GangPlacement.whole_nodes(CLUSTER.id, 2, 1), "s3://ckpt-bucket/b", None, None,
                     "logs", setup_done=setup_done)


def _until(done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def _up(broker_home: Path, sky: SkyStandIn, launched_for: JobSpec) -> SkyPilotProvisioner:
    provisioner = SkyPilotProvisioner(broker_home, lambda _: launched_for, SkyPilotOptions(refresh_s=0.02),
                                      sdk=sky.sdk())
    provisioner.launch(CLUSTER)
    _until(lambda: provisioner.status(CLUSTER).phase is ClusterPhase.UP)
    return provisioner


def _task(sky: SkyStandIn, name: str) -> dict[str, object]:
    _until(lambda: any(j.name == name for c in sky.clusters.values() for j in c.jobs))
    return next(j.task for c in sky.clusters.values() for j in c.jobs if j.name == name)


def test_an_early_setup_is_an_exec_asking_for_no_gpu_and_its_outcome_is_read(broker_home: Path,
                                                                              skypilot: SkyStandIn) -> None:
    sky = skypilot
    provisioner = _up(broker_home, sky, _spec("a", "pip install a"))
    b = _spec("b", "pip install b")
    provisioner.prepare_job(CLUSTER, _launch(b, "j-b"))
    task = _task(sky, "j-b-1-setup")
    assert "accelerators" not in task["resources"]  # type: ignore[operator]
    assert "pip install b" in str(task["run"]) and task["envs"]["BROKER_JOB_ID"] == "j-b"  # type: ignore[index]
    _until(lambda: provisioner.prepare_status(CLUSTER, "j-b", 1).phase is RunPhase.RUNNING)
    sky.finish_job("j-b-1-setup", "FAILED")
    _until(lambda: provisioner.prepare_status(CLUSTER, "j-b", 1).phase is RunPhase.FAILED)
    sky.finish_job("j-b-1-setup", "SUCCEEDED")
    _until(lambda: provisioner.prepare_status(CLUSTER, "j-b", 1).phase is RunPhase.SUCCEEDED)
    provisioner.prepare_job(CLUSTER, _launch(b, "j-b"))  # asked again: not a second exec
    assert sky.count("exec") == 1


def test_a_stopped_early_setup_is_cancelled_in_the_clusters_queue(broker_home: Path, skypilot: SkyStandIn) -> None:
    sky = skypilot
    provisioner = _up(broker_home, sky, _spec("a", "pip install a"))
    provisioner.prepare_job(CLUSTER, _launch(_spec("b", "sleep 300"), "j-b"))
    _task(sky, "j-b-1-setup")
    provisioner.stop_prepare(CLUSTER, "j-b", 1)
    _until(lambda: all(j.status == "CANCELLED" for c in sky.clusters.values() for j in c.jobs))


def test_the_run_carries_the_setup_only_when_neither_the_launch_nor_an_early_setup_ran_it(
        broker_home: Path, skypilot: SkyStandIn) -> None:
    sky = skypilot
    a = _spec("a", "pip install a")
    provisioner = _up(broker_home, sky, a)
    provisioner.start_job(CLUSTER, _launch(a, "j-a"))  # the cluster's own job: its launch ran the setup
    assert "pip install a" not in str(_task(sky, "j-a-1")["run"])
    b = _spec("b", "pip install b")
    provisioner.start_job(CLUSTER, _launch(b, "j-b", setup_done=True))
    assert "pip install b" not in str(_task(sky, "j-b-1")["run"])
    provisioner.start_job(CLUSTER, _launch(b, "j-c"))  # another job's cluster, no early setup
    run = str(_task(sky, "j-c-1")["run"])
    assert "pip install b" in run and run.index("pip install b") < run.index("-m broker.agent")
    assert "|| exit $?" in run  # a failed setup never reaches the run
