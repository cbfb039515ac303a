"""Fractions of a GPU through the engine: two ``A100:0.5`` jobs on one GPU of one node, at once, and
gangs of a share per node (``T4:0.5`` and ``A100:0.5`` on two nodes)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from broker.config.settings import load_settings
from broker.engine import Engine, machine
from broker.runtime import assemble
from broker.spec.job import parse_job_spec
from broker.store.tables import AllocationRow, ClusterRow, JobRow, LedgerRow
from providers.base import SpotQuote
from providers.trace import write_trace

# Each job records what it was given, then waits for the other to be running too: a job that
# never sees the other running at the same time fails.
JOB = """\
name: {name}
resources:
  accelerators: A100:0.5
{extra}run: |
  env | grep -E '^(CUDA_|BROKER_GPU)' | sort > {out}/{name}.env
  for i in $(seq 600); do [ -f {out}/{other}.env ] && break; sleep 0.1; done
  test -f {out}/{other}.env
  sleep 5  # 150 market seconds together: whole ledger minutes held by both, however late one started
"""

# NVIDIA's MPS control daemon, played at the boundary: ``-d`` leaves a daemon (a sleep) whose pid
# goes where the real one writes it, and notes the environment it was started with.
FAKE_MPS_CONTROL = """\
#!/bin/bash
[ "$1" = "-d" ] || exit 3
echo "started CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" >> "$CUDA_MPS_PIPE_DIRECTORY/daemon.log"
sleep 600 >/dev/null 2>&1 &
echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
"""


def _market(path: Path) -> Path:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    write_trace(path, [SpotQuote("gcp", "us-central1", "us-central1-a", "a2-highgpu-2g", "A100", 2, 2.2, 7.35,
                                 start + timedelta(minutes=t), available_nodes=1) for t in range(600)])
    return path


def _states(engine: Engine, *job_ids: str) -> list[str]:
    with engine.store.transaction() as s:
        return [s.get(JobRow, j).state for j in job_ids]  # type: ignore[union-attr]


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.mark.slow
def test_two_half_gpu_jobs_share_one_gpu_with_mps_and_split_its_minutes(
        tmp_path: Path, broker_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir, pipes, out = tmp_path / "bin", tmp_path / "mps-pipes", tmp_path / "out"
    for d in (bin_dir, out):
        d.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_MPS_CONTROL)
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipes))
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", str(tmp_path / "mps-logs"))
    settings = load_settings(market=_market(tmp_path / "m.csv"), speed=30.0, local_provision_seconds=60.0,
                             max_gpus=2)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    try:
        ids = []
        for name, other, extra in (("a", "b", "broker:\n  gpu_memory: 12\n"), ("b", "a", "")):
            text = JOB.format(name=name, other=other, out=out, extra=extra)
            ids.append(engine.submit(parse_job_spec(text, source=str(tmp_path / f"{name}.yaml"))))
        deadline = time.time() + 180
        while time.time() < deadline and not all(st in ("SUCCEEDED", "FAILED") for st in _states(engine, *ids)):
            engine.step()
            time.sleep(0.05)
        for _ in range(5):
            engine.step()
            time.sleep(0.1)
        with engine.store.transaction() as s:
            jobs = [s.get(JobRow, j) for j in ids]
            clusters = list(s.scalars(select(ClusterRow)))
            allocations = {a.job_id: a for a in s.scalars(select(AllocationRow))}
            ledger = list(s.scalars(select(LedgerRow)))
    finally:
        broker.close()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((pipes / "nvidia-cuda-mps-control.pid").read_text()), signal.SIGTERM)

    assert [j.state for j in jobs] == ["SUCCEEDED", "SUCCEEDED"], [j.reason for j in jobs]
    assert len(clusters) == 1 and clusters[0].gpus_per_node == 2
    a, b = (allocations[j] for j in ids)
    # The second half went onto the GPU the first half holds, not onto the node's empty GPU.
    assert a.gpus == b.gpus and len(a.gpus["0"]) == 1
    assert a.gpu_share == b.gpu_share == 0.5
    env_a, env_b = _env(out / "a.env"), _env(out / "b.env")
    assert env_a["CUDA_VISIBLE_DEVICES"] == env_b["CUDA_VISIBLE_DEVICES"] == str(a.gpus["0"][0])
    assert env_a["BROKER_GPU_SHARE"] == env_b["BROKER_GPU_SHARE"] == "0.5"
    # MPS: one daemon for the node, started without a device list; each job capped at its share.
    assert (pipes / "daemon.log").read_text().splitlines() == ["started CUDA_VISIBLE_DEVICES=unset"]
    for env in (env_a, env_b):
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipes)
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env_a["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288MB"  # its broker.gpu_memory
    assert env_b["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480MB"  # half the A100's 40 GB

    # The ledger: every minute accounts for the node's 2 GPUs exactly once; while both ran, each
    # job held half of the shared GPU.
    per_minute: dict[datetime, float] = defaultdict(float)
    held: dict[datetime, dict[str, float]] = defaultdict(dict)
    for row in ledger:
        per_minute[row.minute] += row.gpus
        held[row.minute][row.holder] = row.gpus
    assert per_minute and all(total == pytest.approx(2.0) for total in per_minute.values())
    both = [m for m, h in held.items() if f"job:{ids[0]}" in h and f"job:{ids[1]}" in h
            and h[f"job:{ids[0]}"] < 1 and h[f"job:{ids[1]}"] < 1]
    assert both and all(held[m][f"job:{j}"] == pytest.approx(0.5) for m in both for j in ids)


@pytest.mark.slow
def test_cpu_and_memory_beside_free_gpus_are_honoured(tmp_path: Path, broker_home: Path) -> None:
    # a2-highgpu-2g: 2 A100, 24 vCPUs. A job with one A100 and 16 CPUs runs; another like it, or a
    # half A100 with 16 CPUs, would find a free GPU there but not 16 more CPUs: neither is placed on
    # that node, and with the fleet capped at its 2 GPUs both wait. A half without CPUs fits.
    settings = load_settings(market=_market(tmp_path / "m.csv"), speed=30.0, local_provision_seconds=60.0,
                             max_gpus=2)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    text = "name: {n}\nresources:\n  accelerators: {acc}\n{cpus}run: sleep 30\n"

    def submit(name: str, acc: str, cpus: str = "  cpus: 16\n") -> str:
        return engine.submit(parse_job_spec(text.format(n=name, acc=acc, cpus=cpus), source=str(tmp_path / name)))

    jobs: list[str] = []
    try:
        jobs.append(submit("a", "A100:1"))
        deadline = time.time() + 120
        while _states(engine, jobs[0]) != ["RUNNING"] and time.time() < deadline:
            engine.step()
            time.sleep(0.05)
        assert _states(engine, jobs[0]) == ["RUNNING"]
        heavy = [submit("b", "A100:1"), submit("c", "A100:0.5")]
        light = submit("d", "A100:0.5", cpus="")
        jobs += [*heavy, light]
        for _ in range(3):
            engine.step()
        assert _states(engine, *heavy) == ["PENDING", "PENDING"]
        assert _states(engine, light)[0] in ("PROVISIONING", "RUNNING")
        with engine.store.transaction() as s:
            assert list(s.scalars(select(ClusterRow.id))) == [f"{jobs[0]}-c1"]
            assert s.get(JobRow, light).gpu_share == 0.5  # type: ignore[union-attr]
    finally:
        for job_id in jobs:
            machine.cancel_job(engine.store, job_id, engine.clock)
        deadline = time.time() + 60
        while time.time() < deadline:  # let the engine tear the cluster down
            engine.step()
            with engine.store.transaction() as s:
                if all(c.state in ("TERMINATED", "FAILED") for c in s.scalars(select(ClusterRow))):
                    break
            time.sleep(0.1)
        broker.close()


GANG_JOB = """\
name: {name}
num_nodes: 2
resources:
  accelerators: {accelerator}:0.5
run: |
  env | grep -E '^(CUDA_VISIBLE|BROKER_GPU_SHARE|SKYPILOT_NODE_RANK)' | sort > {out}/{name}-$SKYPILOT_NODE_RANK.env
  for i in $(seq 600); do [ -f {out}/{other}-$SKYPILOT_NODE_RANK.env ] && break; sleep 0.1; done
  test -f {out}/{other}-$SKYPILOT_NODE_RANK.env
"""


@pytest.mark.slow
@pytest.mark.parametrize(("accelerator", "where", "instance_type", "gpus"), [
    ("A100", ("gcp", "us-central1", "us-central1-a"), "a2-highgpu-2g", 2),
    ("T4", ("aws", "us-east-1", "us-east-1a"), "g4dn.12xlarge", 4),  # SkyPilot's own example asks for T4:0.5
])
def test_two_gangs_of_half_gpus_share_one_gpu_on_each_of_two_nodes(tmp_path: Path, broker_home: Path, accelerator: str,
                                                                   where: tuple[str, str, str], instance_type: str,
                                                                   gpus: int) -> None:
    # SkyPilot's job-queue example: T4:0.5 (or A100:0.5) on each of 2 nodes. One share per node, on two
    # distinct nodes of one cluster (so one GPU type); the second gang joins the first's GPUs, as a
    # half joins a half on one node.
    out = tmp_path / "out"
    out.mkdir()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    market = tmp_path / "m.csv"
    write_trace(market, [SpotQuote(*where, instance_type, accelerator, gpus, 2.2, 7.35,
                                   start + timedelta(minutes=t), available_nodes=2) for t in range(600)])
    settings = load_settings(market=market, speed=30.0, local_provision_seconds=60.0, max_gpus=2 * gpus)
    broker = assemble(settings, fresh_market=True)
    engine = broker.start()
    try:
        ids = [engine.submit(parse_job_spec(GANG_JOB.format(name=name, other=other, out=out, accelerator=accelerator),
                                            source=str(tmp_path / f"{name}.yaml")))
               for name, other in (("a", "b"), ("b", "a"))]
        deadline = time.time() + 180
        while time.time() < deadline and not all(st in ("SUCCEEDED", "FAILED") for st in _states(engine, *ids)):
            engine.step()
            time.sleep(0.05)
        with engine.store.transaction() as s:
            jobs = [s.get(JobRow, j) for j in ids]
            clusters = list(s.scalars(select(ClusterRow)))
            allocations = {a.job_id: a for a in s.scalars(select(AllocationRow))}
    finally:
        broker.close()

    assert [j.state for j in jobs] == ["SUCCEEDED", "SUCCEEDED"], [j.reason for j in jobs]
    assert len(clusters) == 1 and (clusters[0].num_nodes, clusters[0].accelerator) == (2, accelerator)
    a, b = (allocations[j] for j in ids)
    assert sorted(a.gpus) == ["0", "1"] and all(len(g) == 1 for g in a.gpus.values())
    assert a.gpus == b.gpus and a.gpu_share == b.gpu_share == 0.5
    for name, alloc in (("a", a), ("b", b)):
        for rank in (0, 1):
            env = _env(out / f"{name}-{rank}.env")
            assert env["BROKER_GPU_SHARE"] == "0.5"
            assert env["CUDA_VISIBLE_DEVICES"] == str(alloc.gpus[str(rank)][0])
