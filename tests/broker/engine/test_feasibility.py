"""A job no offer of the market can ever hold is refused at submission, naming the field; a job the
market does offer (however scarce, on a bigger node) is never refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from broker.api.app import create_app
from broker.clock import WallClock
from broker.engine.feasibility import never_held
from broker.intake import Intake
from broker.spec.job import parse_job_spec
from broker.store import open_store
from broker.store.tables import JobRow
from broker.tokens import create_api_token
from providers.trace import read_trace
from tests.broker.cli.running import run_cli

BUNDLED = Path(__file__).resolve().parents[3] / "broker" / "data" / "quickstart-market.csv"
OFFERED = frozenset({("V100", 1), ("V100", 4), ("A100", 8)})


def _job(accelerators: str, nodes: int = 1) -> str:
    return f"name: t\nnum_nodes: {nodes}\nresources:\n  accelerators: {accelerators}\nrun: python train.py\n"


@pytest.mark.parametrize(("accelerators", "nodes", "max_gpus"), [
    ("V100:1", 1, None), ("V100:4", 3, None), ("V100:2", 1, None),  # a 4-GPU node holds a 2-GPU gang's node
    ("A100:8", 2, 16), ("V100:1", 16, 16), ("[H100:8, A100:8]", 1, 8), ("V100:2", 4, 16),
])
def test_what_the_market_offers_is_never_refused(accelerators: str, nodes: int, max_gpus: int | None) -> None:
    assert never_held(parse_job_spec(_job(accelerators, nodes), offline=True), OFFERED, max_gpus) is None


@pytest.mark.parametrize(("accelerators", "nodes", "max_gpus", "field", "said"), [
    ("H100:8", 1, None, "resources.accelerators", "no zone of the market offers H100:8 per node (the market has "
                                                  "A100:8, V100:1, V100:4)"),
    ("V100:8", 1, None, "resources.accelerators", "no zone of the market offers V100:8 per node"),
    ("A100:8", 3, 16, "num_nodes", "3 node(s) of 8 GPUs need 24 GPUs, more than the broker may hold (max_gpus: 16)"),
    ("V100:1", 17, 16, "num_nodes", "17 node(s) of 1 GPUs need 17 GPUs"),
    ("V100:2", 5, 16, "num_nodes", "5 node(s) of 4 GPUs need 20 GPUs"),  # only 4-GPU nodes hold 2 GPUs
])
def test_what_no_offer_can_hold_is_refused_naming_the_field(accelerators: str, nodes: int, max_gpus: int | None,
                                                            field: str, said: str) -> None:
    problem = never_held(parse_job_spec(_job(accelerators, nodes), source="job.yaml", offline=True), OFFERED,
                         max_gpus)
    assert problem is not None and problem.field == field and said in str(problem)
    assert str(problem).startswith(f"job.yaml: {field}: ")


def test_every_zone_of_the_bundled_market_is_accepted_for_what_it_offers() -> None:
    zones = read_trace(BUNDLED).zones
    offered = {(z.accelerator, z.gpus_per_node) for z in zones}
    for accelerator, gpus in sorted(o for o in offered if o[1] > 0):  # its CPU-only nodes take no accelerators
        spec = parse_job_spec(_job(f"{accelerator}:{gpus}", 2), offline=True)
        assert never_held(spec, offered, 2 * gpus) is None, (accelerator, gpus)
        assert never_held(spec, offered, 2 * gpus - 1) is not None


def _refused_and_nothing_stored(argv: list[str], home: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``broker ARGV`` exits 2 with one line and no traceback, and stores no job: that line."""
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    store = open_store(f"sqlite:///{home / 'broker.db'}")
    try:
        with store.transaction() as s:
            assert s.scalar(select(func.count()).select_from(JobRow)) == 0
    finally:
        store.dispose()
    return err


def test_launch_refuses_a_gang_over_max_gpus_and_stores_nothing(tmp_path: Path, broker_home: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BROKER_MAX_GPUS", "4")
    job = tmp_path / "job.yaml"
    job.write_text(_job("V100:1", 5))
    err = _refused_and_nothing_stored(["launch", str(job)], broker_home, capsys)
    assert "job.yaml: num_nodes: 5 node(s) of 1 GPUs need 5 GPUs, more than the broker may hold (max_gpus: 4)" in err


def test_the_api_refuses_with_a_422_naming_the_field_and_stores_nothing(db_url: str, broker_home: Path) -> None:
    store = open_store(db_url)
    try:
        app = create_app(store, WallClock(), Intake(broker_home, "local", OFFERED, offline=True, max_gpus=8))
        headers = {"Authorization": f"Bearer {create_api_token(store, 'alpha').token}"}
        client = TestClient(app)
        for text, field in ((_job("A100:8", 2), "num_nodes"), (_job("H100:8"), "resources.accelerators")):
            response = client.post("/v1/jobs", content=json.dumps({"spec": text}),
                                   headers={**headers, "Content-Type": "application/json"})
            assert response.status_code == 422, response.text
            assert response.json()["detail"][0]["loc"] == ["body", "spec", *field.split(".")]
        accepted = client.post("/v1/jobs", json={"spec": _job("V100:2", 2)}, headers=headers)  # on 4-GPU nodes
        assert accepted.status_code == 201, accepted.text
        with store.transaction() as s:
            assert s.scalar(select(func.count()).select_from(JobRow)) == 1
    finally:
        store.dispose()


TIED = "name: t\nresources:\n  instance_type: p4d.24xlarge\n  accelerators: A100:8\nrun: python train.py\n"
TYPED = frozenset({("A100", 8, "a2-highgpu-8g"), ("V100", 1, "p3.2xlarge")})


def test_a_choice_tied_to_an_instance_type_needs_that_type_in_the_market() -> None:
    # `instance_type` with `accelerators` pins the choice to that type at placement: a market selling
    # A100:8 only as another type can never hold it.
    spec = parse_job_spec(TIED, source="job.yaml", offline=True)
    problem = never_held(spec, TYPED, None)
    assert problem is not None and problem.field == "resources.accelerators"
    assert ("no zone of the market offers A100:8 on p4d.24xlarge per node (the market has A100:8 (a2-highgpu-8g), "
            "V100:1 (p3.2xlarge))") in str(problem)
    assert never_held(spec, TYPED | {("A100", 8, "p4d.24xlarge")}, None) is None
    untied = parse_job_spec(_job("A100:8"), offline=True)
    assert never_held(untied, TYPED, None) is None
    assert never_held(spec, {("A100", 8)}, None) is None  # a market that does not say its types: any may


def test_launch_refuses_a_job_tied_to_a_type_the_market_lacks_and_stores_nothing(
        tmp_path: Path, broker_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    market = tmp_path / "market.csv"
    market.write_text("time,cloud,region,zone,instance_type,accelerator,gpus_per_node,spot_price,on_demand_price,"
                      "available_nodes\n"
                      "2025-01-01T00:00:00Z,gcp,us-central1,us-central1-a,a2-highgpu-8g,A100,8,9.0,29.4,2\n"
                      "2025-01-01T00:05:00Z,gcp,us-central1,us-central1-a,a2-highgpu-8g,A100,8,9.0,29.4,2\n")
    job = tmp_path / "job.yaml"
    job.write_text(TIED)
    err = _refused_and_nothing_stored(["launch", str(job), "--market", str(market), "--detach"], broker_home, capsys)
    assert "resources.accelerators: no zone of the market offers A100:8 on p4d.24xlarge per node" in err
