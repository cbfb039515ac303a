"""A job's progress through the API is estimated on the broker's clock, as `broker status` embedded does it.

On the embedded default the broker's clock is the replayed market's (60x): a job's allocations are on
it, so an estimate read against the wall clock would count nothing (the wall clock is hours behind).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.backends.local.provisioner import LocalWorld
from broker.config.settings import load_settings
from broker.intake import Intake
from broker.store import open_store
from broker.store.tables import AllocationRow, ClusterRow, JobRow
from broker.tokens import create_api_token
from tests.broker.cli.running import run_cli


def test_status_through_the_api_and_embedded_give_the_same_estimate(engine_held: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    home = engine_held
    # A replay begun an hour ago at 60x: its clock is 59 hours ahead of the wall clock.
    (home / "local").mkdir(parents=True)
    (home / "local" / "world.json").write_text(json.dumps({"trace": "market.csv", "wall_origin": time.time() - 3600,
                                                           "speed": 60.0}))
    world = LocalWorld.load(home)
    assert world is not None
    market_now = world.clock.now()
    store = open_store(load_settings().database_url)
    began = market_now - timedelta(hours=10)
    with store.transaction() as s:
        s.add(JobRow(id="j-clock", name="train", team="alpha", state="RUNNING", priority=500, spec={}, backend="local",
                     num_nodes=1, gpus_per_node=1, accelerator="V100", checkpoint_dir="/ckpt/j-clock", zones=[],
                     work_s=100 * 3600.0, created_at=began, updated_at=began, started_at=began))
        s.flush()
        s.add(ClusterRow(id="c-1", launch_key="c-1", job_id="j-clock", backend="local", cloud="aws", region="us-east-1",
                         zone="us-east-1a", instance_type="p3.2xlarge", accelerator="V100", gpus_per_node=1,
                         num_nodes=1, spot=True, price_per_node_hour=0.9, on_demand_price_per_node_hour=3.06,
                         state="UP", handle={}, created_at=began, up_at=began))
        s.flush()
        s.add(AllocationRow(job_id="j-clock", cluster_id="c-1", attempt=1, gpus={"0": [0]}, started_at=began,
                            running_at=began))
    token = create_api_token(store, "alpha").token
    client = TestClient(create_app(store, world.clock, Intake(home, "local")))
    try:
        served = client.get("/v1/jobs/j-clock", headers={"Authorization": f"Bearer {token}"})
        listed = client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    finally:
        store.dispose()
    assert served.status_code == 200, served.text
    code, out, err = run_cli(["status", "j-clock", "--json"], capsys)
    assert code == 0, err
    embedded = json.loads(out)
    # Ten market hours of a hundred: 10 % (a minute of wall time between the reads would be 1 % at 60x).
    assert embedded["progress_text"] == "10% (estimated from run time)"
    for summary in (served.json(), listed.json()[0]):
        assert (summary["progress_source"], summary["progress_text"]) == (embedded["progress_source"],
                                                                          embedded["progress_text"])
        assert summary["progress_share"] == pytest.approx(embedded["progress_share"], abs=0.001)
