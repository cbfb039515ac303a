"""The quickstart end to end with a stand-in ``pynvml`` first on the nodes' path (the default NVML path,
no sampler setting) replaying 3 % utilisation: its running GPU-hours become held idle (mostly stalled)
and its status shows the mean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select

from broker.store import open_store
from broker.store.gpu import GpuMinuteRow
from tests.fakenvml import pynvml as fake

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quickstart_at_3_percent_is_held_idle_stalled(broker_home: Path) -> None:
    readings = ROOT / "examples" / "gpu" / "idle-3pct.json"  # what docs/gpu-utilisation.md runs
    env = {**os.environ, "BROKER_HOME": str(broker_home), "FAKE_NVML_READINGS": str(readings),
           "PYTHONPATH": os.pathsep.join([str(Path(fake.__file__).parent), str(ROOT)])}
    launched = subprocess.run([sys.executable, "-m", "broker", "launch", "examples/quickstart.yaml", "--json"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    summary = json.loads(launched.stdout.strip().splitlines()[-1])
    assert summary["state"] == "SUCCEEDED"
    store = open_store(f"sqlite:///{broker_home / 'broker.db'}")
    with store.transaction() as s:
        measured = s.scalar(select(func.count()).select_from(GpuMinuteRow))
    store.dispose()
    assert measured
    status = subprocess.run([sys.executable, "-m", "broker", "status", summary["job_id"], "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    gpu = json.loads(status.stdout)["gpu"]
    assert gpu["mean_utilization"] == pytest.approx(0.03) and gpu["peak_memory_gb"] == pytest.approx(2.0)
    report = subprocess.run([sys.executable, "-m", "broker", "report", "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    totals = json.loads(report.stdout)["totals"]
    held, parts = totals["idle_gpu_hours"].get("held_idle", 0.0), totals["held_idle_parts"]
    # Every running GPU-hour was measured at 3 %: none is useful. Most of it is stalled; what came
    # before each attempt's first progress report (numpy's import, restoring the checkpoint) is startup.
    assert held > 0 and totals["useful_gpu_hours"] < 0.02 * held, totals
    assert parts["stalled"] > 0.6 * held and parts["stalled"] > parts.get("startup", 0.0), totals
    assert sum(parts.values()) == pytest.approx(held)
    assert totals["unmeasured_gpu_hours"] < 0.02 * held, totals
