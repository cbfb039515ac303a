"""The node agent's GPU sampling overhead: CPU seconds per GPU per minute of the job.

Runs the agent's sampler (broker/agent/gpu_sampling.py) for ``--seconds`` on ``--gpus`` GPUs read
through the stand-in ``pynvml`` (tests/fakenvml: the bindings' Python layer, no driver calls),
sampling every ``--every`` seconds, and measures the sampler thread's CPU time; the baseline, in
the same run, is the same thread with a reader that returns nothing (the loop, the aggregation and
the timing alone). On a real GPU each NVML query adds its driver call (a few tens of microseconds):
``--real`` reads the machine's own GPUs through the installed ``nvidia-ml-py`` instead.

    python benchmarks/gpu_sampling.py [--gpus 8] [--seconds 20] [--every 0.05] [--real]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REAL = "--real" in sys.argv[1:]  # the machine's GPUs through the real bindings, not the stand-in
sys.path[:0] = [str(ROOT)] if REAL else [str(ROOT / "tests" / "fakenvml"), str(ROOT)]

from broker.agent.gpu import GpuReading, open_reader  # noqa: E402
from broker.agent.gpu_sampling import GpuSampler  # noqa: E402


class _Quiet:
    def write(self, event: str, **data: Any) -> None:
        print(event, data, file=sys.stderr)


class _Nothing:
    def read(self, pids: frozenset[int]) -> list[GpuReading]:
        return []


class _Counted:
    def __init__(self, reader: Any) -> None:
        self.reader, self.sweeps = reader, 0

    def read(self, pids: frozenset[int]) -> list[GpuReading]:
        self.sweeps += 1
        return list(self.reader.read(pids))


def _run(reader: Any, seconds: float, every: float) -> tuple[float, int]:
    """The sampler thread's CPU seconds and its sweeps (one reading of every GPU) in ``seconds``."""
    counted = _Counted(reader)
    sampler = GpuSampler(lambda: counted, frozenset, None, _Quiet(), sample_s=every, report_s=3600.0)
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    return sampler.cpu_s, counted.sweeps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=0.05, help="sampling interval (the agent's default: 5 s)")
    parser.add_argument("--real", action="store_true", help="every GPU of this machine, through nvidia-ml-py")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        readings = Path(tmp) / "readings.json"
        readings.write_text(json.dumps({"devices": [
            {"uuid": f"GPU-{i}", "memory_total_mb": 81920,
             "readings": [{"gpu": 40 + i, "memory": 10, "used_mb": 30000, "power_w": 250.0}]}
            for i in range(args.gpus)]}))
        os.environ["FAKE_NVML_READINGS"] = str(readings)
        nvml = open_reader({} if args.real else {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(args.gpus))})
        if args.real:
            args.gpus = len(nvml.read(frozenset()))
        base_cpu, base_sweeps = _run(_Nothing(), args.seconds, args.every)
        cpu, sweeps = _run(nvml, args.seconds, args.every)
    per_sweep = cpu / sweeps if sweeps else float("nan")
    per_minute = per_sweep * (60.0 / 5.0) / args.gpus  # at the agent's 5 s default
    print(f"GPUs {args.gpus}, {sweeps:.0f} sweeps of all GPUs in {args.seconds:.0f} s")
    print(f"sampler CPU per sweep:           {1e6 * per_sweep:8.1f} us (all {args.gpus} GPUs)")
    print(f"baseline (empty reader) per sweep: {1e6 * base_cpu / max(base_sweeps, 1):6.1f} us")
    print(f"CPU per GPU per minute at 5 s:   {1e3 * per_minute:8.3f} ms ({100 * per_minute / 60:.5f} % of a core)")


if __name__ == "__main__":
    main()
