"""``/metrics`` exports each running job's latest measured GPU minute under DCGM's names, and the alert reads them."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.clock import WallClock
from broker.intake import Intake
from broker.store import open_store
from broker.store.gpu import GpuMinuteRow
from broker.store.tables import AllocationRow, ClusterRow, JobRow

ALERTS = Path(__file__).resolve().parents[3] / "monitoring" / "alerts.yml"
DASHBOARD = ALERTS.parent / "grafana" / "dashboards" / "spot-broker.json"


def test_running_jobs_gpus_under_dcgm_names_and_the_idle_alert_reads_them(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    with store.transaction() as s:
        for job_id, state in (("j-run", "RUNNING"), ("j-done", "SUCCEEDED")):
            s.add(JobRow(id=job_id, name="train", team="ml", state=state, priority=500, spec={}, backend="local",
                         num_nodes=1, gpus_per_node=2, checkpoint_dir="c", created_at=now, updated_at=now, zones=[],
                         attempt=1))
            s.flush()
            s.add(ClusterRow(id=f"c-{job_id}", launch_key=job_id, job_id=job_id, backend="local", cloud="aws",
                             region="r", zone="z", instance_type="p4d.24xlarge", accelerator="A100", gpus_per_node=2,
                             num_nodes=1, spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0,
                             state="UP", handle={}, created_at=now))
            s.flush()
            s.add(AllocationRow(job_id=job_id, cluster_id=f"c-{job_id}", attempt=1, gpus={"0": [0, 1]},
                                started_at=now - timedelta(hours=1)))
            for back, util in ((3, 80.0), (1, 3.0), (30, 99.0)):  # the latest fresh minute wins; 30 min ago is stale
                for gpu in (0, 1):
                    s.add(GpuMinuteRow(job_id=job_id, attempt=1, cluster_id=f"c-{job_id}", node="0", gpu=gpu,
                                       uuid=f"GPU-{gpu}", started_at=now - timedelta(minutes=back),
                                       ended_at=now - timedelta(minutes=back - 1), samples=12, seconds=60.0,
                                       utilization_mean=util + gpu, utilization_max=util + gpu,
                                       memory_used_mb_max=1000.0, memory_total_mb=40960.0,
                                       power_w_mean=None if gpu else 61.5, received_at=now))
    client = TestClient(create_app(store, WallClock(), Intake(tmp_path, "local", None), is_leader=lambda: True))
    body = client.get("/metrics").text
    store.dispose()
    lines = [line for line in body.splitlines() if line.startswith("DCGM_")]
    labels = 'Hostname="c-j-run:0",UUID="GPU-0",gpu="0",job_id="j-run",modelName="A100",team="ml"'
    assert f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 3.0" in lines
    assert f"DCGM_FI_DEV_FB_USED{{{labels}}} 1000.0" in lines
    assert f"DCGM_FI_DEV_FB_FREE{{{labels}}} 39960.0" in lines
    assert f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 61.5" in lines
    assert not [line for line in lines if "POWER" in line and 'gpu="1"' in line]  # not given: not exported
    assert not [line for line in lines if "j-done" in line]  # only running jobs
    assert len([line for line in lines if line.startswith("DCGM_FI_DEV_GPU_UTIL")]) == 2
    exported = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in lines}
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    idle = next(r for r in rules if r["alert"] == "BrokerJobGpusIdle")
    assert set(re.findall(r"\bDCGM_[A-Z_]+", idle["expr"])) <= exported
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\bDCGM_[A-Z_]+", target["expr"])}
    assert queried and queried <= exported
