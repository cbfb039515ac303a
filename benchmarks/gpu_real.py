"""On a real GPU: the agent's NVML readings against ``nvidia-smi``, and the report's ``stalled`` share.

Runs ``examples/gpu/half-idle.yaml`` (a PyTorch job busy on the GPU for half its time, asleep on the
CPU for the other half, in blocks of two minutes) through ``broker launch`` on the local backend, in
a fresh ``BROKER_HOME`` with the market clock at wall speed, the agent reading the GPU through the
installed ``nvidia-ml-py`` (the default NVML path). Beside it, the baseline: ``nvidia-smi`` polled
every second. Then, for every minute the agent reported, its mean utilisation against nvidia-smi's
mean over the same wall-clock span, and from ``broker report --json`` the share of the job's GPU
time attributed to ``stalled`` (expected: about half).

Needs a machine with an NVIDIA GPU, its driver, ``nvidia-smi``, PyTorch with CUDA and
``pip install nvidia-ml-py``; takes about ``--minutes`` plus one.

    python benchmarks/gpu_real.py [--minutes 8] [--block 120]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _check() -> None:
    problems = []
    if shutil.which("nvidia-smi") is None:
        problems.append("nvidia-smi is not on PATH")
    try:
        import pynvml  # noqa: F401
    except ImportError:
        problems.append("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        import torch

        if not torch.cuda.is_available():
            problems.append("PyTorch sees no CUDA device")
    except ImportError:
        problems.append("PyTorch is not installed")
    if problems:
        sys.exit("gpu_real: needs a GPU machine: " + "; ".join(problems))


class Smi:
    """``nvidia-smi`` polled every second, each line stamped with the wall clock when read."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, float, float]] = []  # (time, gpu, utilisation %, memory MiB)
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits",
             "-lms", "1000"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                index, util, memory = (x.strip() for x in line.split(","))
                self.samples.append((time.time(), int(index), float(util), float(memory)))
            except ValueError:
                continue

    def mean(self, gpu: int, start: float, end: float) -> float | None:
        values = [u for t, g, u, _ in self.samples if g == gpu and start <= t < end]
        return sum(values) / len(values) if values else None

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _broker(env: dict[str, str], *args: str, timeout: float) -> Any:
    done = subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"broker {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1] if args[0] == "launch" else done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--block", type=float, default=120.0)
    args = parser.parse_args()
    _check()
    from sqlalchemy import select

    from broker.store import open_store
    from broker.store.gpu import GpuMinuteRow
    from broker.store.tables import JobRow

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        spec = Path(tmp) / "half-idle.yaml"
        text = (ROOT / "examples" / "gpu" / "half-idle.yaml").read_text()
        spec.write_text(text.replace("--minutes 8 --block 120", f"--minutes {args.minutes:g} --block {args.block:g}")
                        .replace("workdir: .", f"workdir: {ROOT}"))
        env = {**os.environ, "BROKER_HOME": str(home), "BROKER_SPEED": "1", "BROKER_LOCAL_PROVISION_SECONDS": "5",
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        env.pop("BROKER_GPU_SAMPLER", None)
        smi = Smi()
        began = time.time()
        try:
            summary = _broker(env, "launch", str(spec), "--json", timeout=args.minutes * 60 + 600)
        finally:
            smi.stop()
        wall = time.time() - began
        status = _broker(env, "status", summary["job_id"], "--json", timeout=120)
        report = _broker(env, "report", "--json", timeout=120)
        store = open_store(f"sqlite:///{home / 'broker.db'}")
        with store.transaction() as s:
            job = s.get(JobRow, summary["job_id"])
            assert job is not None and job.wall_started_at is not None
            created, wall_start = job.created_at, job.wall_started_at
            minutes = [(m.gpu, m.started_at, m.ended_at, m.utilization_mean) for m in
                       s.scalars(select(GpuMinuteRow).where(GpuMinuteRow.job_id == job.id)
                                 .order_by(GpuMinuteRow.started_at))]
        store.dispose()

    def wall_of(at: datetime) -> float:  # the market clock runs at wall speed (BROKER_SPEED=1)
        return (wall_start + (at - created)).timestamp()

    print(f"job {summary['job_id']}: {summary['state']} in {wall:.0f} s; {len(minutes)} GPU-minutes reported; "
          f"nvidia-smi {len(smi.samples)} samples")
    print("minute  agent %  nvidia-smi %  diff")
    diffs = []
    for gpu, start, end, util in minutes:
        reference = smi.mean(gpu, wall_of(start), wall_of(end))
        if util is None or reference is None:
            continue
        diffs.append(abs(util - reference))
        print(f"{(start - created) / timedelta(minutes=1):6.1f}  {util:7.1f}  {reference:11.1f}  "
              f"{util - reference:+5.1f}")
    if diffs:
        print(f"agreement: {sum(d <= 10 for d in diffs)} of {len(diffs)} minutes within 10 points; "
              f"mean |diff| {sum(diffs) / len(diffs):.1f}, max {max(diffs):.1f}")
    totals = report["totals"]
    held = totals["idle_gpu_hours"].get("held_idle", 0.0)
    running = totals["useful_gpu_hours"] + held
    parts = totals["held_idle_parts"]
    print(f"status gpu: {json.dumps(status.get('gpu'))}")
    print(f"report: running GPU-h {running:.4f}, useful {totals['useful_gpu_hours']:.4f}, held_idle {held:.4f} "
          f"(startup {parts.get('startup', 0):.4f}, checkpoint {parts.get('checkpoint', 0):.4f}, "
          f"stalled {parts.get('stalled', 0):.4f}); unmeasured {totals['unmeasured_gpu_hours']:.4f}")
    if running > 0:
        print(f"stalled share of the job's running GPU time: {parts.get('stalled', 0) / running:.1%} "
              f"(the job slept {(args.minutes * 60 // args.block // 2) * args.block / (args.minutes * 60):.0%} "
              f"of its steps: the baseline)")
    print(f"measured at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
