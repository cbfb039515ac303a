"""``GET /v1/teams`` and the teams' figures on ``/metrics``: what the fair-share step sees, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.clock import WallClock
from broker.config.teams import FairShareConfig
from broker.intake import Intake
from broker.store import open_store
from broker.store.tables import JobRow
from broker.tokens import create_api_token
from policies.fair_share import Team

JOB = "name: train\nresources:\n  accelerators: V100:1\nrun: python train.py\n"


def test_teams_owed_held_and_waiting(db_url: str, broker_home: Path) -> None:
    store = open_store(db_url)
    config = FairShareConfig(teams=(Team("alpha", weight=3), Team("beta")), capacity_gpus=4,
                             budgets=(("beta", 50.0),))
    app = create_app(store, WallClock(), Intake(broker_home, "local", frozenset({("V100", 1)})), fair_share=config)
    client = TestClient(app)
    alpha = {"Authorization": f"Bearer {create_api_token(store, 'alpha').token}"}
    beta = {"Authorization": f"Bearer {create_api_token(store, 'beta').token}"}
    assert client.get("/v1/teams").status_code == 401
    ids = [client.post("/v1/jobs", json={"spec": JOB}, headers=alpha).json()["job_id"] for _ in range(4)]
    client.post("/v1/jobs", json={"spec": JOB}, headers=beta)
    with store.transaction() as s:  # alpha's four run: it holds the whole fleet
        for job_id in ids:
            row = s.get(JobRow, job_id)
            assert row is not None
            row.state = "RUNNING"
        waiting = s.query(JobRow).filter(JobRow.team == "beta").one()
        waiting.reason = "waiting: reclaiming 1 GPU from team alpha"
    response = client.get("/v1/teams", headers=beta)
    assert response.status_code == 200
    body = response.json()
    assert body["capacity_gpus"] == 4
    lines = {line["team"]: line for line in body["teams"]}
    assert (lines["alpha"]["owed_gpus"], lines["alpha"]["held_gpus"], lines["alpha"]["borrowed_gpus"]) == (3.0, 4, 1.0)
    assert (lines["beta"]["owed_gpus"], lines["beta"]["held_gpus"], lines["beta"]["queued"],
            lines["beta"]["waiting"]) == (1.0, 0, 1, 1)
    assert lines["beta"]["budget_left"] == pytest.approx(50.0) and lines["alpha"]["budget_left"] is None
    metrics = client.get("/metrics").text
    assert 'broker_team_owed_gpus{team="alpha"} 3.0' in metrics
    assert 'broker_team_borrowed_gpus{team="alpha"} 1.0' in metrics
    assert 'broker_team_jobs_waiting{team="beta"} 1.0' in metrics
    assert 'broker_team_budget_left_dollars{team="beta"} 50.0' in metrics
    store.dispose()


def test_no_teams_route_without_teams(db_url: str, broker_home: Path) -> None:
    store = open_store(db_url)
    client = TestClient(create_app(store, WallClock(), Intake(broker_home, "local", None)))
    token = create_api_token(store, "alpha").token
    assert client.get("/v1/teams", headers={"Authorization": f"Bearer {token}"}).status_code == 404
    assert "broker_team_" not in client.get("/metrics").text
    store.dispose()
