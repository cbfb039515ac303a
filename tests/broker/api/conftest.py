from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.clock import WallClock
from broker.intake import Intake
from broker.store import Store, open_store
from broker.tokens import create_api_token

JOB = """\
name: train
num_nodes: 1
resources:
  accelerators: V100:1
run: python train.py
"""


@dataclass
class Api:
    client: TestClient
    store: Store
    home: Path
    alpha: dict[str, str]  # Authorization headers of team alpha
    beta: dict[str, str]

    def submit(self, headers: dict[str, str], text: str = JOB) -> str:
        response = self.client.post("/v1/jobs", json={"spec": text}, headers=headers)
        assert response.status_code == 201, response.text
        return str(response.json()["job_id"])


@pytest.fixture
def api(db_url: str, broker_home: Path) -> Api:
    store = open_store(db_url)
    app = create_app(store, WallClock(), Intake(broker_home, "local", frozenset({("V100", 1), ("A100", 8)})))
    alpha = create_api_token(store, "alpha").token
    beta = create_api_token(store, "beta").token
    return Api(TestClient(app), store, broker_home, {"Authorization": f"Bearer {alpha}"},
               {"Authorization": f"Bearer {beta}"})
