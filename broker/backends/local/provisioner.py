"""The local backend: clusters are process groups on this machine, the market is a replayed trace.

Each cluster is a directory under ``$BROKER_HOME/local/clusters/`` and a detached host process
(``broker.backends.local.host``) that plays the cloud. A job's nodes are node agents running the
job's ``setup`` and ``run`` with the same variables SkyPilot gives a task.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from broker.agent.catching import may_send
from broker.backends.base import (
    ClusterInfo,
    ClusterPhase,
    ClusterStatus,
    JobLaunch,
    RunPhase,
    RunStatus,
)
from broker.backends.local.claims import (
    bury_unlaunched,
    claim_node,
    identity,
    missing_fate,
    node_fate,
    record_gang,
)
from broker.backends.local.host import process_alive, read_json, write_json
from broker.backends.local.scripts import START_FAILED, job_script, private_file, script_head, setup_script
from broker.backends.local.steady import Look, Steady, mtime_ns
from broker.clock import AcceleratedClock
from broker.store.private import private_directory, private_opener
from providers.local import LocalMarket
from providers.trace import MarketTrace, read_trace

log = logging.getLogger("broker.backends.local")


@dataclass(frozen=True)
class LocalWorld:
    """The replay every local cluster shares: which trace, and where tick 0 sits on the wall clock."""

    trace_path: str
    clock: AcceleratedClock

    @classmethod
    def load(cls, home: Path) -> LocalWorld | None:
        data = read_json(home / "local" / "world.json")
        if data is None:
            return None
        return cls(data["trace"], AcceleratedClock(data["wall_origin"], data["speed"]))

    @classmethod
    def begin(cls, home: Path, trace_path: str, speed: float) -> LocalWorld:
        world = cls(str(Path(trace_path).resolve()), AcceleratedClock.starting_now(speed))
        (home / "local").mkdir(parents=True, exist_ok=True)
        write_json(home / "local" / "world.json",
                   {"trace": world.trace_path, "wall_origin": world.clock.wall_origin, "speed": speed})
        return world

    def market(self, trace: MarketTrace | None = None) -> LocalMarket:
        return LocalMarket(trace or read_trace(self.trace_path), self.clock.origin)


# How long a claimed node may wait for its process while its claimer lives (frozen, or slow): past it,
# the run is NO_PROCESS. A claimer that died is given up sooner (``local_claims``).
CLAIM_SECONDS = 60.0


class LocalProvisioner:
    name = "local"

    def __init__(self, home: Path, world: LocalWorld, provision_seconds: float = 120.0,
                 agent_poll: str = "100ms", claim_seconds: float = CLAIM_SECONDS) -> None:
        self.root = home / "local" / "clusters"
        self.world = world
        self.provision_seconds = provision_seconds
        self.agent_poll = agent_poll
        self.claim_seconds = claim_seconds
        self.steady = Steady()  # what earlier looks found, while the files stay unchanged (a cache)

    def cluster_dir(self, cluster: ClusterInfo) -> Path:
        return self.root / cluster.id

    def launch(self, cluster: ClusterInfo) -> None:
        directory = self.cluster_dir(cluster)
        if (directory / "cluster.json").exists():
            return  # already launched: launching again is a no-op
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "procs").mkdir(exist_ok=True)
        write_json(directory / "cluster.json", {
            "cluster_id": cluster.id,
            "trace": self.world.trace_path,
            "wall_origin": self.world.clock.wall_origin,
            "speed": self.world.clock.speed,
            "key": {"cloud": cluster.cloud, "region": cluster.region, "zone": cluster.zone,
                    "instance_type": cluster.instance_type},
            "num_nodes": cluster.num_nodes,
            "gpus_per_node": cluster.gpus_per_node,
            "spot": cluster.spot,
            "provision_seconds": self.provision_seconds,
        })
        with open(directory / "host.log", "ab", opener=private_opener) as log:
            subprocess.Popen([sys.executable, "-m", "broker.backends.local.host", str(directory)],
                             stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)

    def status(self, cluster: ClusterInfo) -> ClusterStatus:
        return self._status(cluster, {})

    def statuses(self, clusters: list[ClusterInfo]) -> dict[str, ClusterStatus]:
        """Every cluster's status in one pass over their files, each host process looked at once."""
        alive: dict[int, bool] = {}
        found = {cluster.id: self._status(cluster, alive) for cluster in clusters}
        self.steady.keep_statuses({self.cluster_dir(cluster) for cluster in clusters})
        return found

    def _status(self, cluster: ClusterInfo, alive: dict[int, bool]) -> ClusterStatus:
        """``alive``: host pid -> alive, as already looked at in this call (filled in here)."""
        directory = self.cluster_dir(cluster)
        launched, data = self.steady.status_file(directory)
        if not launched:
            return ClusterStatus(ClusterPhase.UNKNOWN)
        if data is None:
            if not self._host_alive(directory) and self._launch_age(directory) > 30:
                return ClusterStatus(ClusterPhase.FAILED, reason="local cluster host never started")
            return ClusterStatus(ClusterPhase.PROVISIONING)
        phase = ClusterPhase(data["state"])
        if phase in (ClusterPhase.PROVISIONING, ClusterPhase.UP) and not self._host_alive(directory, data, alive):
            # The host died without a word: the nodes are gone, as a vanished VM would be.
            return ClusterStatus(ClusterPhase.TERMINATED, reason="local cluster host vanished",
                                 ended_at=datetime.now(UTC))
        clock = self.world.clock
        return ClusterStatus(
            phase=phase,
            reason=data.get("reason"),
            capacity_error=bool(data.get("capacity_error")),
            up_at=clock.to_clock(data["up_wall"]) if data.get("up_wall") else None,
            ended_at=clock.to_clock(data["ended_wall"]) if data.get("ended_wall") else None,
            handle={"metadata_port": data.get("metadata_port"), "dir": str(directory)},
            notice_action_at=clock.to_clock(data["notice_action_wall"]) if data.get("notice_action_wall") else None,
        )

    def _launch_age(self, directory: Path) -> float:
        return time.time() - (directory / "cluster.json").stat().st_mtime

    def _host_alive(self, directory: Path, data: dict[str, object] | None = None,
                    alive: dict[int, bool] | None = None) -> bool:
        """``data``: the cluster's status file as just read (else read here); ``alive``: pids looked at already."""
        pid = (data if data is not None else read_json(directory / "status.json") or {}).get("host_pid")
        if pid is None:
            return self._launch_age(directory) < 30
        known = alive if alive is not None else {}
        if int(str(pid)) not in known:
            known[int(str(pid))] = process_alive(pid)
        return known[int(str(pid))]

    def _node_dir(self, cluster: ClusterInfo, job_id: str, attempt: int, rank: int) -> Path:
        return self.cluster_dir(cluster) / "runs" / f"{job_id}-{attempt}" / f"node-{rank}"

    def start_job(self, cluster: ClusterInfo, launch: JobLaunch) -> None:
        status = self.status(cluster)
        if status.phase is not ClusterPhase.UP:
            raise RuntimeError(f"cluster {cluster.id} is {status.phase}, not UP")
        port = status.handle["metadata_port"]
        spec = launch.spec
        workdir = self._workdir(launch)
        signal_name = spec.broker.checkpoint.signal
        node_ips = ["127.0.0.1"] * len(launch.placement.nodes)
        private_directory(Path(launch.log_dir))
        Path(launch.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        record_gang(self.cluster_dir(cluster) / "runs" / f"{launch.job_id}-{launch.attempt}", len(node_ips))
        for rank in range(len(launch.placement.nodes)):
            node_dir = self._node_dir(cluster, launch.job_id, launch.attempt, rank)
            # The claim, atomic: of two callers starting one node (a restarted broker, or a stale
            # leader that woke inside this call while the new one starts the job), only one goes on.
            # One that dies before the launch leaves a claim ``run_status`` gives up (``local_claims``).
            if not claim_node(node_dir):
                continue  # started, or being started: do not start a second copy
            variables = launch.env(rank, node_ips)
            # The job's command and variables go through files: the argument list and the
            # environment of an exec hold 128 KB per string, and a job file may hold more.
            script = job_script(node_dir, signal_name, workdir, None if launch.setup_done else spec.setup, spec.run,
                                variables)
            command = [
                sys.executable, "-m", "broker.agent", "--cloud", "local",
                "--metadata-url", f"http://127.0.0.1:{port}",
                "--signal", signal_name, "--poll", self.agent_poll,
                "--cluster-id", cluster.id, "--node", str(rank),
                "--checkpoint-dir", launch.checkpoint_dir,
                "--status-file", str(node_dir / "status"),
            ]
            if launch.broker_url:
                command += ["--broker-url", launch.broker_url]
            if cluster.agent_token:
                command += ["--token-file", str(private_file(node_dir / "token", cluster.agent_token))]
            command += ["--", "bash", str(script)]
            small = {k: v for k, v in variables.items() if k not in spec.envs and len(k) + len(v) < 4096}
            self._spawn(cluster, node_dir, launch, rank, command, small)

    def _workdir(self, launch: JobLaunch) -> Path:
        spec = launch.spec
        return spec.resolved_workdir() or (Path(spec.source).parent if spec.source else Path.cwd())

    def _spawn(self, cluster: ClusterInfo, node_dir: Path, launch: JobLaunch, rank: int, command: list[str],
               variables: dict[str, str]) -> None:
        """Start one node's process, its output to the attempt's node log, recorded for teardown to kill."""
        env = {**os.environ, **variables, "PYTHONUNBUFFERED": "1",
               # A local node's `python` is the broker's own interpreter, as a cloud image's would be.
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        log_path = Path(launch.log_dir) / f"attempt-{launch.attempt}-node-{rank}.log"
        with open(log_path, "ab", opener=private_opener) as log:
            if not node_dir.is_dir():  # set aside while this start was frozen: another attempt has the GPUs
                raise RuntimeError(f"{node_dir.name} was given up before its launch; not launching it")
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        (self.cluster_dir(cluster) / "procs" / str(process.pid)).write_text(str(process.pid))
        (node_dir / "started").write_text(json.dumps(identity(process.pid)))

    def _prepare_dir(self, cluster: ClusterInfo, job_id: str, attempt: int) -> Path:
        return self.cluster_dir(cluster) / "prepare" / f"{job_id}-{attempt}"

    def prepare_job(self, cluster: ClusterInfo, launch: JobLaunch) -> None:
        """Each node of the gang runs the job's setup now, beside whatever runs there; its exit code is
        written to ``exit_code`` and its output goes ahead of the run's in the attempt's node log."""
        if self.status(cluster).phase is not ClusterPhase.UP:
            raise RuntimeError(f"cluster {cluster.id} is not UP")
        if not launch.spec.setup:
            return
        node_ips = ["127.0.0.1"] * len(launch.placement.nodes)
        private_directory(Path(launch.log_dir))
        for rank in range(len(launch.placement.nodes)):
            node_dir = self._prepare_dir(cluster, launch.job_id, launch.attempt) / f"node-{rank}"
            if (node_dir / "started").exists():
                continue
            node_dir.mkdir(parents=True, exist_ok=True)
            head = script_head(node_dir, launch.spec.broker.checkpoint.signal, launch.env(rank, node_ips))
            setup = shlex.quote(str(setup_script(node_dir, head, self._workdir(launch), launch.spec.setup)))
            done = shlex.quote(str(node_dir / "exit_code"))
            self._spawn(cluster, node_dir, launch, rank,
                        ["bash", "-c", f"bash {setup}; echo $? > {done}.tmp; mv {done}.tmp {done}"], {})

    def prepare_status(self, cluster: ClusterInfo, job_id: str, attempt: int) -> RunStatus:
        nodes = sorted(self._prepare_dir(cluster, job_id, attempt).glob("node-*"))
        if not nodes:
            return RunStatus(RunPhase.NOT_STARTED)
        codes: list[int | None] = []
        for node in nodes:
            try:
                codes.append(int((node / "exit_code").read_text()))
            except (OSError, ValueError):
                codes.append(None)
        for node, code in zip(nodes, codes, strict=True):
            if code:
                return RunStatus(RunPhase.FAILED, code, f"{node.name}: setup exited with code {code}")
        if all(code == 0 for code in codes):
            return RunStatus(RunPhase.SUCCEEDED, 0)
        if self.status(cluster).phase in (ClusterPhase.TERMINATED, ClusterPhase.FAILED):
            return RunStatus(RunPhase.LOST)
        for node, code in zip(nodes, codes, strict=True):
            if code is None and not process_alive((read_json(node / "started") or {}).get("pid")):
                return RunStatus(RunPhase.FAILED, None, f"{node.name}: setup stopped before it ended")
        return RunStatus(RunPhase.RUNNING)

    def stop_prepare(self, cluster: ClusterInfo, job_id: str, attempt: int) -> None:
        for node in self._prepare_dir(cluster, job_id, attempt).glob("node-*"):
            pid = (read_json(node / "started") or {}).get("pid")
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(pid), signal.SIGKILL)

    def run_status(self, cluster: ClusterInfo, job_id: str, attempt: int) -> RunStatus:
        return self._run_status(cluster, job_id, attempt, Look(self._status))

    def run_statuses(self, runs: list[tuple[ClusterInfo, str, int]]) -> dict[tuple[str, int], RunStatus]:
        """``run_status`` of every (cluster, job, attempt) in one pass over their files: each cluster's
        status and each recorded process looked at once, however many runs share them."""
        look = Look(self._status)
        found = {(job_id, attempt): self._run_status(cluster, job_id, attempt, look)
                 for cluster, job_id, attempt in runs}
        self.steady.keep_only({(cluster.id, job_id, attempt) for cluster, job_id, attempt in runs})
        return found

    def _run_status(self, cluster: ClusterInfo, job_id: str, attempt: int, look: Look) -> RunStatus:
        """The run's status; a run found running whose directories have not changed since is looked at through
        its cluster's status and its processes alone (``steady``), with no file of the run read."""
        base = self.cluster_dir(cluster) / "runs" / f"{job_id}-{attempt}"
        key = (cluster.id, job_id, attempt)
        steady = self.steady.run(key, base)
        if steady is not None and look.status(cluster).phase not in (ClusterPhase.TERMINATED, ClusterPhase.FAILED) \
                and all(look.same_process_alive(process) for process in steady.processes):
            return RunStatus(RunPhase.RUNNING)
        before = self.steady.before(base)
        nodes = sorted(base.glob("node-*"))
        node_times = [mtime_ns(node) for node in nodes]
        found = self._look_at_run(cluster, base, nodes, look)
        if found.phase is RunPhase.RUNNING:
            self.steady.running(key, base, nodes, before, node_times)
        else:
            self.steady.forget(key)
        return found

    def _look_at_run(self, cluster: ClusterInfo, base: Path, nodes: list[Path], look: Look) -> RunStatus:
        if not nodes:
            return RunStatus(RunPhase.NOT_STARTED)
        codes = [read_json(n / "status") for n in nodes]
        if all(c is not None for c in codes):
            exit_codes = [int(c["exit_code"]) for c in codes if c is not None]
            failed = [c for c in exit_codes if c != 0]
            if not failed:
                return RunStatus(RunPhase.SUCCEEDED, 0)
            if look.status(cluster).phase is ClusterPhase.TERMINATED:
                return RunStatus(RunPhase.LOST)
            for node in nodes:
                with contextlib.suppress(OSError):
                    said = (node / START_FAILED).read_text(errors="replace").strip()
                    return RunStatus(RunPhase.START_FAILED, failed[0], f"{node.name}: {said[:200]}")
            return RunStatus(RunPhase.FAILED, failed[0])
        if look.status(cluster).phase in (ClusterPhase.TERMINATED, ClusterPhase.FAILED):
            return RunStatus(RunPhase.LOST)
        # A node no process runs, nor ever will: its start died after the claim, or its agent did.
        for node, code in zip(nodes, codes, strict=True):
            fate = None if code is not None else node_fate(node, self.claim_seconds, alive=look.same_process_alive)
            if fate is not None:
                return RunStatus(RunPhase.NO_PROCESS, None, f"{node.name}: {fate}")
        missing = missing_fate(base, nodes, self.claim_seconds)
        return RunStatus(RunPhase.NO_PROCESS, None, missing) if missing else RunStatus(RunPhase.RUNNING)

    def _run_groups(self, cluster: ClusterInfo, job_id: str, attempt: int) -> list[tuple[int, int | None]]:
        """(agent pid, job process group) of every node of one run."""
        groups = []
        for node_dir in (self.cluster_dir(cluster) / "runs" / f"{job_id}-{attempt}").glob("node-*"):
            started = read_json(node_dir / "started") or {}
            try:
                job_group: int | None = int((node_dir / "status.pgid").read_text())
            except (OSError, ValueError):
                job_group = None
            if "pid" in started:
                groups.append((int(started["pid"]), job_group))
        return groups

    def signal_job(self, cluster: ClusterInfo, job_id: str, attempt: int, signal_name: str) -> None:
        number = signal.Signals[signal_name if signal_name.startswith("SIG") else f"SIG{signal_name}"]
        for _, job_group in self._run_groups(cluster, job_id, attempt):
            if job_group is None:
                continue
            if not may_send(job_group, number):
                # Not started far enough to catch it: its default action would kill the job. The
                # broker asks again at its next interval.
                log.info("job %s-%s has no %s handler yet: not signalled", job_id, attempt, number.name)
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job_group, number)

    def stop_job(self, cluster: ClusterInfo, job_id: str, attempt: int) -> None:
        for agent, job_group in self._run_groups(cluster, job_id, attempt):
            for group in (job_group, agent):
                if group is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(group, signal.SIGKILL)
        bury_unlaunched(self.cluster_dir(cluster) / "runs" / f"{job_id}-{attempt}", self.claim_seconds)

    def terminate(self, cluster: ClusterInfo) -> None:
        directory = self.cluster_dir(cluster)
        if directory.exists():
            (directory / "terminate").touch()

    def events(self, cluster: ClusterInfo) -> list[dict[str, object]]:
        """Every agent event on the cluster, for diagnostics and the notice-delay measurement."""
        records: list[dict[str, object]] = []
        for path in sorted(self.cluster_dir(cluster).glob("runs/*/node-*/status.events")):
            records.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
        return records
