"""The local backend's node start and capacity, with real cluster hosts and node agents."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.backends.base import ClusterInfo, ClusterPhase, JobLaunch, RunPhase
from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.spec.job import parse_job_spec
from policies.gang import GangPlacement

TOKEN = "agent-token-must-not-show-in-ps"


def _trace(path: Path, available: list[int]) -> Path:
    """One zone, one tick a minute, ``available`` spot nodes per tick."""
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    rows = ["time,cloud,region,zone,instance_type,accelerator,gpus_per_node,spot_price,on_demand_price,"
            "available_nodes"]
    for tick, nodes in enumerate(available):
        when = (start + timedelta(minutes=tick)).strftime("%Y-%m-%dT%H:%M:%SZ")
        rows.append(f"{when},aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,{nodes}")
    path.write_text("\n".join(rows) + "\n")
    return path


def _cluster(name: str, token: str | None = None) -> ClusterInfo:
    return ClusterInfo(name, "aws", "us-east-1", "us-east-1a", "p3.2xlarge", 1, 1, True, agent_token=token)


def _wait(predicate, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.fixture
def provisioner(broker_home: Path, tmp_path: Path) -> LocalProvisioner:
    # Trace time runs at wall speed, so nothing is preempted during a test.
    world = LocalWorld.begin(broker_home, str(_trace(tmp_path / "trace.csv", [2] * 600)), speed=1.0)
    return LocalProvisioner(broker_home, world, provision_seconds=0)


def _stop_all(provisioner: LocalProvisioner, clusters: list[ClusterInfo]) -> None:
    for cluster in clusters:
        provisioner.terminate(cluster)
    for cluster in clusters:
        _wait(lambda c=cluster: provisioner.status(c).phase in (ClusterPhase.TERMINATED, ClusterPhase.FAILED))


def _all_command_lines() -> list[str]:
    lines = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return lines


def test_a_1mb_run_and_300kb_envs_start_and_the_token_stays_off_argv(provisioner: LocalProvisioner,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = parse_job_spec("name: big\nresources:\n  accelerators: V100:1\nrun: 'true'\n", offline=True)
    filler = "\n".join(f"# filler line {i:07d} " + "x" * 100 for i in range(1024 * 1024 // 120))
    run = (f"{filler}\n"
           f'echo "run ${{#BIG}} $([ -n "${{BROKER_AGENT_TOKEN:-}}" ] && echo leaked || echo clean)" > {out}\n'
           "sleep 3\n")
    spec = dataclasses.replace(spec, run=run, envs={"BIG": "y" * 300_000, "SMALL": "it's"})
    assert len(run) > 1024 * 1024
    cluster = _cluster("c-big", TOKEN)
    provisioner.launch(cluster)
    try:
        _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.UP)
        launch = JobLaunch("j-big", 1, spec, GangPlacement("c-big", ((0, (0,)),)), str(tmp_path / "ckpt"), None,
                           None, str(tmp_path / "logs"))
        provisioner.start_job(cluster, launch)
        _wait(lambda: out.exists() and out.read_text().strip())
        assert out.read_text().split() == ["run", "300000", "clean"]
        assert provisioner.run_status(cluster, "j-big", 1).phase is RunPhase.RUNNING
        # While the job runs: the token is in no process's argument list, only in a private file.
        assert not [line for line in _all_command_lines() if TOKEN in line]
        node = provisioner.cluster_dir(cluster) / "runs" / "j-big-1" / "node-0"
        for name in ("token", "env.sh", "job.sh"):
            assert stat.S_IMODE((node / name).stat().st_mode) == 0o600, name
        assert (node / "token").read_text() == TOKEN
        _wait(lambda: provisioner.run_status(cluster, "j-big", 1).phase is RunPhase.SUCCEEDED)
    finally:
        _stop_all(provisioner, [cluster])


def test_one_call_says_of_every_cluster_what_status_says_of_each(provisioner: LocalProvisioner) -> None:
    clusters = [_cluster("s-ended"), _cluster("s-up"), _cluster("s-never-launched")]
    for cluster in clusters[:2]:
        provisioner.launch(cluster)
    try:
        _wait(lambda: all(provisioner.status(c).phase is ClusterPhase.UP for c in clusters[:2]))
        provisioner.terminate(clusters[0])
        _wait(lambda: provisioner.status(clusters[0]).phase is ClusterPhase.TERMINATED)
        statuses = provisioner.statuses(clusters)
        assert statuses == {c.id: provisioner.status(c) for c in clusters}
        assert [statuses[c.id].phase for c in clusters] == [ClusterPhase.TERMINATED, ClusterPhase.UP,
                                                            ClusterPhase.UNKNOWN]
    finally:
        _stop_all(provisioner, clusters[:2])


def test_spot_clusters_never_exceed_the_zones_available_nodes(provisioner: LocalProvisioner) -> None:
    clusters = [_cluster(f"c-{i}") for i in range(4)]
    for cluster in clusters:
        provisioner.launch(cluster)
    try:
        phases = _wait(lambda: [p for p in (provisioner.status(c).phase for c in clusters)
                                if p is not ClusterPhase.PROVISIONING] if all(
            provisioner.status(c).phase is not ClusterPhase.PROVISIONING for c in clusters) else None)
        assert phases.count(ClusterPhase.UP) == 2  # the trace offers 2 nodes in the zone
        failed = [provisioner.status(c) for c in clusters if provisioner.status(c).phase is ClusterPhase.FAILED]
        assert len(failed) == 2 and all(s.capacity_error and "2 of its 2 in use" in (s.reason or "") for s in failed)
        # A cluster that ends gives its room back.
        up = [c for c in clusters if provisioner.status(c).phase is ClusterPhase.UP]
        provisioner.terminate(up[0])
        _wait(lambda: provisioner.status(up[0]).phase is ClusterPhase.TERMINATED)
        again = _cluster("c-again")
        clusters.append(again)
        provisioner.launch(again)
        _wait(lambda: provisioner.status(again).phase is ClusterPhase.UP)
    finally:
        _stop_all(provisioner, clusters)


def test_when_the_zone_shrinks_the_youngest_cluster_is_preempted(broker_home: Path, tmp_path: Path) -> None:
    # 2 nodes for 20 ticks (20 wall seconds), then 1: of two 1-node clusters only the older may stay.
    world = LocalWorld.begin(broker_home, str(_trace(tmp_path / "shrink.csv", [2] * 20 + [1] * 600)), speed=60.0)
    provisioner = LocalProvisioner(broker_home, world, provision_seconds=0)
    older, younger = _cluster("c-old"), _cluster("c-young")
    provisioner.launch(older)
    _wait(lambda: provisioner.status(older).phase is ClusterPhase.UP)
    provisioner.launch(younger)
    try:
        _wait(lambda: provisioner.status(younger).phase is ClusterPhase.UP)
        _wait(lambda: provisioner.status(younger).phase is ClusterPhase.TERMINATED, timeout=60)
        assert "reclaimed" in (provisioner.status(younger).reason or "")
        assert provisioner.status(older).phase is ClusterPhase.UP
        status = json.loads((provisioner.cluster_dir(younger) / "status.json").read_text())
        assert status.get("notice_wall")  # a notice came first, as a cloud's would
    finally:
        _stop_all(provisioner, [older, younger])


def test_an_interruption_asked_for_gives_the_notice_at_once_and_takes_the_nodes_after_it(
        broker_home: Path, tmp_path: Path) -> None:
    """Whatever the trace says (room in the zone for hours), an ``interrupt`` file is a spot interruption
    now: the notice on the node's metadata service first, the nodes taken its two market minutes later."""
    speed = 30.0  # the notice is 4 wall seconds
    world = LocalWorld.begin(broker_home, str(_trace(tmp_path / "steady.csv", [2] * 600)), speed=speed)
    provisioner = LocalProvisioner(broker_home, world, provision_seconds=0)
    cluster = _cluster("c-interrupted")
    provisioner.launch(cluster)
    try:
        _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.UP)
        status_file = provisioner.cluster_dir(cluster) / "status.json"
        assert "notice_wall" not in json.loads(status_file.read_text())
        (provisioner.cluster_dir(cluster) / "interrupt").touch()
        _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.TERMINATED, timeout=120)
        assert "reclaimed" in (provisioner.status(cluster).reason or "")
        status = json.loads(status_file.read_text())
        notice, action, ended = status["notice_wall"], status["notice_action_wall"], status["ended_wall"]
        assert notice < ended and action <= ended  # the nodes went at the time the notice named, not before
        assert action - notice <= 120 / speed  # two market minutes of notice at most (IMDS rounds down)
    finally:
        _stop_all(provisioner, [cluster])


def test_the_agent_refuses_a_token_file_others_can_read(tmp_path: Path) -> None:
    import subprocess
    import sys

    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "broker.agent", "--cloud", "local", "--token-file", str(token),
                           "--", "true"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "BROKER_HOME": str(tmp_path)})
    assert done.returncode != 0
    assert "readable by others" in done.stderr and "Traceback" not in done.stderr


def test_callers_starting_one_node_at_once_start_one_copy(provisioner: LocalProvisioner, tmp_path: Path) -> None:
    """Two leaders may start the same attempt at once: the new one, and a stale one that woke inside
    its call (its fence was checked before it froze). The node runs once all the same."""
    spec = parse_job_spec("name: once\nresources:\n  accelerators: V100:1\nrun: sleep 2\n", offline=True)
    cluster = _cluster("c-once")
    provisioner.launch(cluster)
    try:
        _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.UP)
        launch = JobLaunch("j-once", 1, spec, GangPlacement("c-once", ((0, (0,)),)), str(tmp_path / "ckpt"), None,
                           None, str(tmp_path / "logs"))
        callers = 8
        barrier = threading.Barrier(callers)

        def start() -> None:
            barrier.wait()
            provisioner.start_job(cluster, launch)

        threads = [threading.Thread(target=start) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        provisioner.start_job(cluster, launch)  # and once more, after: a restarted broker's start
        assert len(list((provisioner.cluster_dir(cluster) / "procs").iterdir())) == 1
        _wait(lambda: provisioner.run_status(cluster, "j-once", 1).phase is RunPhase.SUCCEEDED)
    finally:
        _stop_all(provisioner, [cluster])


def _held_launch(provisioner: LocalProvisioner, tmp_path: Path, name: str,
                 run: str) -> tuple[ClusterInfo, JobLaunch, Path]:
    """An UP cluster and a launch whose node log is a FIFO: a start claims the node, writes its
    scripts, then blocks opening the log, between the claim and the launch, until someone reads it."""
    spec = parse_job_spec(f"name: {name}\nresources:\n  accelerators: V100:1\nrun: {json.dumps(run)}\n",
                          offline=True)
    cluster = _cluster(f"c-{name}", TOKEN)
    provisioner.launch(cluster)
    _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.UP)
    logs = tmp_path / "logs"
    logs.mkdir()
    fifo = logs / "attempt-1-node-0.log"
    os.mkfifo(fifo)
    launch = JobLaunch(f"j-{name}", 1, spec, GangPlacement(cluster.id, ((0, (0,)),)), str(tmp_path / "ckpt"), None,
                       None, str(logs))
    return cluster, launch, fifo


def _start_in_a_broker_process(provisioner: LocalProvisioner, cluster: ClusterInfo,
                               launch: JobLaunch) -> multiprocessing.process.BaseProcess:
    broker = multiprocessing.get_context("fork").Process(target=provisioner.start_job, args=(cluster, launch))
    broker.start()
    node = provisioner.cluster_dir(cluster) / "runs" / f"{launch.job_id}-1" / "node-0"
    _wait(lambda: (node / "job.sh").exists())  # claimed, its scripts written: it now blocks on the log
    time.sleep(0.3)
    assert broker.is_alive() and not (node / "started").exists()
    return broker


@pytest.mark.slow
def test_a_broker_killed_between_the_claim_and_the_launch_leaves_no_run_that_runs_forever(
        broker_home: Path, tmp_path: Path) -> None:
    world = LocalWorld.begin(broker_home, str(_trace(tmp_path / "trace.csv", [2] * 600)), speed=1.0)
    provisioner = LocalProvisioner(broker_home, world, provision_seconds=0, claim_seconds=600)
    out = tmp_path / "ran"
    cluster, launch, fifo = _held_launch(provisioner, tmp_path, "killed", f"echo ran >> {out}")
    try:
        broker = _start_in_a_broker_process(provisioner, cluster, launch)
        assert provisioner.run_status(cluster, launch.job_id, 1).phase is RunPhase.RUNNING  # its claimer lives
        os.kill(broker.pid, signal.SIGKILL)  # the broker dies between the claim and the launch
        broker.join(timeout=10)
        fifo.unlink()
        # A restarted broker, or the other replica, sees at once that the node's claimer is gone and no
        # process ever came (the claim bound, 600 s here, is for a claimer that lives).
        status = _wait(lambda: (s := provisioner.run_status(cluster, launch.job_id, 1)).phase
                       is not RunPhase.RUNNING and s, timeout=30)
        assert status.phase is RunPhase.NO_PROCESS, status
        assert "node-0" in (status.reason or "") and "never launched" in (status.reason or "")
        provisioner.start_job(cluster, launch)  # starting the same attempt again still starts nothing twice
        assert not (provisioner.cluster_dir(cluster) / "runs" / f"{launch.job_id}-1" / "node-0" / "started").exists()
        provisioner.stop_job(cluster, launch.job_id, 1)
        # The engine's next attempt starts it, once.
        provisioner.start_job(cluster, dataclasses.replace(launch, attempt=2))
        _wait(lambda: provisioner.run_status(cluster, launch.job_id, 2).phase is RunPhase.SUCCEEDED)
        assert out.read_text() == "ran\n"
    finally:
        _stop_all(provisioner, [cluster])


@pytest.mark.slow
def test_a_frozen_claimer_is_given_up_after_the_bound_and_its_late_launch_runs_nothing(
        broker_home: Path, tmp_path: Path) -> None:
    world = LocalWorld.begin(broker_home, str(_trace(tmp_path / "trace.csv", [2] * 600)), speed=1.0)
    provisioner = LocalProvisioner(broker_home, world, provision_seconds=0, claim_seconds=3)
    out = tmp_path / "ran"
    cluster, launch, fifo = _held_launch(provisioner, tmp_path, "frozen", f"echo ran >> {out}")
    try:
        broker = _start_in_a_broker_process(provisioner, cluster, launch)
        began = time.time()
        status = _wait(lambda: (s := provisioner.run_status(cluster, launch.job_id, 1)).phase
                       is not RunPhase.RUNNING and s, timeout=30)
        assert status.phase is RunPhase.NO_PROCESS and time.time() - began >= 2, status
        provisioner.stop_job(cluster, launch.job_id, 1)  # the engine ends the attempt
        # The frozen broker wakes and goes on with its launch: what it launches finds no node to run on.
        with open(fifo, "rb"):
            broker.join(timeout=30)
        assert broker.exitcode != 0  # it raised: the node it claimed was given up
        time.sleep(3)
        assert not out.exists() and not list((provisioner.cluster_dir(cluster) / "procs").iterdir())
        assert not (provisioner.cluster_dir(cluster) / "runs" / f"{launch.job_id}-1" / "node-0").exists()
        assert provisioner.run_status(cluster, launch.job_id, 1).phase is RunPhase.NOT_STARTED
    finally:
        _stop_all(provisioner, [cluster])


@pytest.mark.slow
def test_a_node_agent_killed_before_it_reports_is_seen_and_its_job_stopped(provisioner: LocalProvisioner,
                                                                          tmp_path: Path) -> None:
    spec = parse_job_spec("name: agent\nresources:\n  accelerators: V100:1\nrun: sleep 120\n", offline=True)
    cluster = _cluster("c-agent")
    provisioner.launch(cluster)
    try:
        _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.UP)
        launch = JobLaunch("j-agent", 1, spec, GangPlacement(cluster.id, ((0, (0,)),)), str(tmp_path / "ckpt"), None,
                           None, str(tmp_path / "logs"))
        provisioner.start_job(cluster, launch)
        node = provisioner.cluster_dir(cluster) / "runs" / "j-agent-1" / "node-0"
        group = int(_wait(lambda: (node / "status.pgid").exists() and (node / "status.pgid").read_text()))
        assert provisioner.run_status(cluster, "j-agent", 1).phase is RunPhase.RUNNING
        os.kill(json.loads((node / "started").read_text())["pid"], signal.SIGKILL)
        status = _wait(lambda: (s := provisioner.run_status(cluster, "j-agent", 1)).phase
                       is not RunPhase.RUNNING and s, timeout=30)
        assert status.phase is RunPhase.NO_PROCESS and "stopped before it reported" in (status.reason or ""), status
        provisioner.stop_job(cluster, "j-agent", 1)
        _wait(lambda: not _group_alive(group), timeout=10)
    finally:
        _stop_all(provisioner, [cluster])


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_launch_that_raises_after_the_claim_is_given_up_after_the_bound(broker_home: Path, tmp_path: Path) -> None:
    world = LocalWorld.begin(broker_home, str(_trace(tmp_path / "trace.csv", [2] * 600)), speed=1.0)
    provisioner = LocalProvisioner(broker_home, world, provision_seconds=0, claim_seconds=3)
    spec = parse_job_spec("name: raises\nresources:\n  accelerators: V100:1\nrun: 'true'\n", offline=True)
    cluster = _cluster("c-raises")
    provisioner.launch(cluster)
    try:
        _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.UP)
        logs = tmp_path / "logs"
        (logs / "attempt-1-node-0.log").mkdir(parents=True)  # the node's log cannot be opened: the launch raises
        launch = JobLaunch("j-raises", 1, spec, GangPlacement(cluster.id, ((0, (0,)),)), str(tmp_path / "ckpt"),
                           None, None, str(logs))
        with pytest.raises(IsADirectoryError):
            provisioner.start_job(cluster, launch)
        began = time.time()
        # Its claimer (this process) lives on, and nobody handled the error: given up after the bound.
        assert provisioner.run_status(cluster, "j-raises", 1).phase is RunPhase.RUNNING
        status = _wait(lambda: (s := provisioner.run_status(cluster, "j-raises", 1)).phase
                       is not RunPhase.RUNNING and s, timeout=30)
        assert status.phase is RunPhase.NO_PROCESS and time.time() - began >= 2, status
        assert "never launched" in (status.reason or "")
    finally:
        _stop_all(provisioner, [cluster])


@pytest.mark.slow
def test_a_gang_whose_broker_died_before_its_last_node_launched_is_given_up_and_stopped_whole(
        broker_home: Path, tmp_path: Path) -> None:
    world = LocalWorld.begin(broker_home, str(_trace(tmp_path / "trace.csv", [2] * 600)), speed=1.0)
    provisioner = LocalProvisioner(broker_home, world, provision_seconds=0, claim_seconds=600)
    spec = parse_job_spec("name: gang\nnum_nodes: 2\nresources:\n  accelerators: V100:1\nrun: sleep 120\n",
                          offline=True)
    cluster = ClusterInfo("c-gang", "aws", "us-east-1", "us-east-1a", "p3.2xlarge", 2, 1, True)
    provisioner.launch(cluster)
    try:
        _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.UP)
        logs = tmp_path / "logs"
        logs.mkdir()
        os.mkfifo(logs / "attempt-1-node-1.log")  # node 0 launches; the start blocks before node 1's launch
        launch = JobLaunch("j-gang", 1, spec, GangPlacement(cluster.id, ((0, (0,)), (1, (0,)))),
                           str(tmp_path / "ckpt"), None, None, str(logs))
        broker = multiprocessing.get_context("fork").Process(target=provisioner.start_job, args=(cluster, launch))
        broker.start()
        run = provisioner.cluster_dir(cluster) / "runs" / "j-gang-1"
        group = int(_wait(lambda: (run / "node-0" / "status.pgid").exists()
                          and (run / "node-0" / "status.pgid").read_text()))
        _wait(lambda: (run / "node-1" / "job.sh").exists())
        assert provisioner.run_status(cluster, "j-gang", 1).phase is RunPhase.RUNNING
        os.kill(broker.pid, signal.SIGKILL)
        broker.join(timeout=10)
        (logs / "attempt-1-node-1.log").unlink()
        status = _wait(lambda: (s := provisioner.run_status(cluster, "j-gang", 1)).phase
                       is not RunPhase.RUNNING and s, timeout=30)
        assert status.phase is RunPhase.NO_PROCESS and (status.reason or "").startswith("node-1: "), status
        provisioner.stop_job(cluster, "j-gang", 1)  # the half that runs is stopped: a gang runs whole or not
        _wait(lambda: not _group_alive(group), timeout=10)
        assert [p.name for p in run.glob("node-*")] == ["node-0"]
    finally:
        _stop_all(provisioner, [cluster])


SLOW_HANDLER = """
import signal, sys, time
from pathlib import Path
d = Path(sys.argv[1])
(d / "ready").write_text("")
while not (d / "go").exists():  # still importing its framework: no handler yet
    time.sleep(0.02)
signal.signal(signal.SIGUSR1, lambda *_: (d / "got").write_text(""))
(d / "handled").write_text("")
while not (d / "got").exists():
    time.sleep(0.02)
"""


def test_a_checkpoint_request_waits_for_the_jobs_handler(provisioner: LocalProvisioner, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    script = tmp_path / "job.py"
    script.write_text(SLOW_HANDLER)
    spec = parse_job_spec("name: slow\nresources:\n  accelerators: V100:1\nrun: 'true'\n", offline=True)
    spec = dataclasses.replace(spec, run=f"{sys.executable} {script} {tmp_path}")
    cluster = _cluster("c-slow")
    provisioner.launch(cluster)
    try:
        _wait(lambda: provisioner.status(cluster).phase is ClusterPhase.UP)
        launch = JobLaunch("j-slow", 1, spec, GangPlacement(cluster.id, ((0, (0,)),)), str(tmp_path / "ckpt"), None,
                           None, str(tmp_path / "logs"))
        provisioner.start_job(cluster, launch)
        _wait(lambda: (tmp_path / "ready").exists())
        with caplog.at_level(logging.INFO, logger="broker.backends.local"):
            provisioner.signal_job(cluster, "j-slow", 1, "SIGUSR1")
        assert "job j-slow-1 has no SIGUSR1 handler yet: not signalled" in caplog.messages
        (tmp_path / "go").write_text("")
        _wait(lambda: (tmp_path / "handled").exists())
        provisioner.signal_job(cluster, "j-slow", 1, "SIGUSR1")
        _wait(lambda: provisioner.run_status(cluster, "j-slow", 1).phase is RunPhase.SUCCEEDED)
        assert (tmp_path / "got").exists()
    finally:
        _stop_all(provisioner, [cluster])


def test_one_call_says_of_every_run_what_run_status_says_of_each(provisioner: LocalProvisioner) -> None:
    """Runs written as hosts and agents write them, one process standing in for the live ones: running,
    ended, failed, never started, an agent gone, a host gone, and two runs on one cluster."""
    from broker.backends.local.claims import identity

    live = subprocess.Popen(["sleep", "600"], start_new_session=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        def run(cluster: ClusterInfo, job_id: str, host: int, agent: int | None, code: int | None) -> None:
            directory = provisioner.cluster_dir(cluster)
            node = directory / "runs" / f"{job_id}-1" / "node-0"
            node.mkdir(parents=True, exist_ok=True)
            (directory / "cluster.json").write_text(json.dumps({"cluster_id": cluster.id}))
            (directory / "status.json").write_text(json.dumps({"state": "UP", "host_pid": host}))
            (node.parent / "gang.json").write_text(json.dumps({"nodes": 1, **identity(live.pid)}))
            if agent is not None:
                (node / "started").write_text(json.dumps(identity(agent)))
            if code is not None:
                (node / "status").write_text(json.dumps({"exit_code": code}))

        shared, alone, lost = _cluster("r-shared"), _cluster("r-alone"), _cluster("r-lost")
        run(shared, "running", live.pid, live.pid, None)
        run(shared, "ended", live.pid, live.pid, 0)
        run(alone, "failed", live.pid, live.pid, 1)
        run(alone, "agent-gone", live.pid, gone.pid, None)
        run(lost, "host-gone", gone.pid, live.pid, None)
        runs = [(shared, "running", 1), (shared, "ended", 1), (alone, "failed", 1), (alone, "agent-gone", 1),
                (lost, "host-gone", 1), (shared, "never-started", 1)]
        statuses = provisioner.run_statuses(runs)
        assert statuses == {(job_id, attempt): provisioner.run_status(cluster, job_id, attempt)
                            for cluster, job_id, attempt in runs}
        assert [statuses[(job_id, 1)].phase for _, job_id, _ in runs] == [
            RunPhase.RUNNING, RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.NO_PROCESS, RunPhase.LOST,
            RunPhase.NOT_STARTED]
        assert provisioner.run_statuses([]) == {}
    finally:
        live.kill()
        live.wait()
