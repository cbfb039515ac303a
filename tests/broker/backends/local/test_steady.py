"""A run found running is looked at again through its processes alone while its files stay unchanged;
any change to them, a process gone or its cluster gone, and the files are read as before."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.backends.base import ClusterInfo, RunPhase
from broker.backends.local.claims import identity
from broker.backends.local.host import write_json
from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.backends.local.steady import SETTLE_NS

CLUSTER = ClusterInfo("c1", "aws", "us-east-1", "us-east-1a", "p3.2xlarge", 1, 1, True)
RUN = (CLUSTER, "j1", 1)


@pytest.fixture
def process() -> Iterator[subprocess.Popen[bytes]]:
    """One process standing in for the cluster's host and the node's agent."""
    running = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield running
    running.kill()
    running.wait()


def _provisioner(home: Path, tmp_path: Path) -> LocalProvisioner:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    trace = tmp_path / "trace.csv"
    trace.write_text("time,cloud,region,zone,instance_type,accelerator,gpus_per_node,spot_price,on_demand_price,"
                     f"available_nodes\n{start.strftime('%Y-%m-%dT%H:%M:%SZ')},aws,us-east-1,us-east-1a,p3.2xlarge,"
                     "V100,1,0.9,3.06,2\n")
    return LocalProvisioner(home, LocalWorld.begin(home, str(trace), speed=1.0), provision_seconds=0)


def _settle(*paths: Path) -> None:
    """The directories last changed well before the next look (as a fleet's are, between steps)."""
    past = time.time() - 2 * SETTLE_NS / 1e9
    for path in paths:
        os.utime(path, (past, past))


def _seed(provisioner: LocalProvisioner, pid: int) -> tuple[Path, Path, Path]:
    """A cluster up with one run on one node, as its host and the node's agent write them."""
    directory = provisioner.cluster_dir(CLUSTER)
    node = directory / "runs" / "j1-1" / "node-0"
    node.mkdir(parents=True)
    write_json(directory / "cluster.json", {"cluster_id": CLUSTER.id})
    write_json(directory / "status.json", {"state": "UP", "host_pid": pid, "metadata_port": 1})
    write_json(node.parent / "gang.json", {"nodes": 1, **identity(pid)})
    (node / "started").write_text(json.dumps(identity(pid)))
    _settle(directory, node.parent, node)
    return directory, node.parent, node


def test_an_unchanged_run_is_answered_from_its_processes_and_a_change_is_read(
        broker_home: Path, tmp_path: Path, process: subprocess.Popen[bytes]) -> None:
    provisioner = _provisioner(broker_home, tmp_path)
    _, run, node = _seed(provisioner, process.pid)
    key = (CLUSTER.id, "j1", 1)
    assert provisioner.run_statuses([RUN]) == {("j1", 1): provisioner.run_status(*RUN)}
    assert provisioner.run_status(*RUN).phase is RunPhase.RUNNING
    assert provisioner.steady.run(key, run) is not None
    # Its process record overwritten in place, which leaves its directory's time: not read while nothing
    # changed (a whole file replaced, as every writer here does, would have changed the directory's time).
    (node / "started").write_text("{}")
    assert provisioner.run_statuses([RUN])[("j1", 1)].phase is RunPhase.RUNNING
    # The node reports its end: a file renamed into its directory, which changes it; the files are read again.
    write_json(node / "status", {"exit_code": 0})
    assert provisioner.steady.run(key, run) is None
    assert provisioner.run_statuses([RUN])[("j1", 1)].phase is RunPhase.SUCCEEDED


def test_a_steady_run_whose_process_ended_is_read_again(
        broker_home: Path, tmp_path: Path, process: subprocess.Popen[bytes]) -> None:
    provisioner = _provisioner(broker_home, tmp_path)
    _seed(provisioner, process.pid)
    assert provisioner.run_statuses([RUN])[("j1", 1)].phase is RunPhase.RUNNING
    process.kill()
    process.wait()
    # The host is gone too (one process stood in for both): the cluster's nodes with it.
    assert provisioner.run_statuses([RUN])[("j1", 1)].phase is RunPhase.LOST


def test_a_run_changed_just_before_a_look_is_not_kept(
        broker_home: Path, tmp_path: Path, process: subprocess.Popen[bytes]) -> None:
    provisioner = _provisioner(broker_home, tmp_path)
    _, run, node = _seed(provisioner, process.pid)
    os.utime(node)  # changed now: within a timestamp's resolution of the look, another change could hide
    assert provisioner.run_statuses([RUN])[("j1", 1)].phase is RunPhase.RUNNING
    assert provisioner.steady.run((CLUSTER.id, "j1", 1), run) is None
