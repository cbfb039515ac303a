"""The quickstart end to end with a stand-in ``pynvml`` first on the nodes' path (the default NVML path,
no sampler setting) replaying 3 % utilisation: its running GPU-hours become held idle (mostly stalled),
its status shows the mean, and what ``/metrics`` exports for it as it runs fires the idle alert under promtool."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from broker.api.gpu_metrics import GpuCollector
from broker.store import open_store
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import JobRow
from tests.fakenvml import pynvml as fake

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "monitoring" / "alerts.yml"


@dataclass
class _At:
    """The broker's clock at one instant (the launch's own clock runs in its process)."""

    at: datetime
    speed: float = 1.0

    def now(self) -> datetime:
        return self.at

    def to_clock(self, wall_epoch: float) -> datetime:
        return self.at


def _exported_as_running(home: Path, job_id: str, tmp: Path) -> list[str]:
    """The DCGM series ``/metrics`` exports for the job as it runs its last attempt, from its measured minutes.

    An agent sends its minutes once a wall minute and when its run ends, so whether any arrive while the
    quickstart's attempt still runs (about 40 s of wall time) depends on the machine's speed. The series
    are therefore read from a copy of the finished store with the job marked RUNNING again, at the
    minute after its last measured one: what a scrape at that moment exported."""
    copy = tmp / "as-running.db"
    shutil.copyfile(home / "broker.db", copy)
    store = open_store(f"sqlite:///{copy}")
    try:
        with store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None
            job.state = "RUNNING"
            latest = s.query(func.max(GpuMinuteRow.started_at)).filter(
                GpuMinuteRow.job_id == job_id, GpuMinuteRow.attempt == job.attempt).scalar()
        assert latest is not None, "no minute measured in the job's last attempt"
        lines = []
        for family in GpuCollector(store, _At(latest + timedelta(minutes=1))).collect():
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                lines.append(f"{sample.name}{{{labels}}} {sample.value}")
        return lines
    finally:
        store.dispose()


def _alert_fires_on(series: list[str], tmp: Path) -> str:
    """promtool's verdict on BrokerJobGpusIdle over these exported series held for 45 minutes."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/test.sh installs Debian's prometheus package")
        pytest.skip("promtool is missing (apt-get install prometheus)")
    util = [line for line in series if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    job = util[0].split('job_id="')[1].split('"')[0]
    team = util[0].split('team="')[1].split('"')[0]
    case = {"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": line.rsplit(" ", 1)[0], "values": f"{float(line.rsplit(' ', 1)[1]):g}x45"}
                         for line in util],
        "alert_rule_test": [{"eval_time": "35m", "alertname": "BrokerJobGpusIdle", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "job_id": job, "team": team},
            "exp_annotations": {
                "summary": f"Job {job} (team {team}) holds its GPUs idle",
                "description": "Its busiest GPU has been under 10 % busy for 30 minutes: see its page on the "
                               "dashboard."}}]}]}]}
    (tmp / "quickstart_test.yml").write_text(yaml.safe_dump(case))
    done = subprocess.run([promtool, "test", "rules", str(tmp / "quickstart_test.yml")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return job


@pytest.mark.slow
def test_the_quickstart_at_3_percent_is_held_idle_stalled(broker_home: Path, tmp_path: Path) -> None:
    readings = ROOT / "examples" / "gpu" / "idle-3pct.json"  # what docs/gpu-utilisation.md runs
    env = {**os.environ, "BROKER_HOME": str(broker_home), "FAKE_NVML_READINGS": str(readings),
           "PYTHONPATH": os.pathsep.join([str(Path(fake.__file__).parent), str(ROOT)])}
    launch = subprocess.run([sys.executable, "-m", "broker", "launch", "examples/quickstart.yaml", "--json"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert launch.returncode == 0, launch.stderr[-3000:]
    summary = json.loads(launch.stdout.strip().splitlines()[-1])
    exported = _exported_as_running(broker_home, summary["job_id"], tmp_path)
    assert exported and all(line.endswith(" 3.0") for line in exported if line.startswith("DCGM_FI_DEV_GPU_UTIL"))
    assert _alert_fires_on(exported, tmp_path) == summary["job_id"]
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
    # The agent's first sample of each attempt comes a sweep after its run starts: on 2 cores under the
    # whole suite that was 2.2 % of the held time, so the bound leaves room for load.
    assert totals["unmeasured_gpu_hours"] < 0.05 * held, totals
