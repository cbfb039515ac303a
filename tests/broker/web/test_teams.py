"""The dashboard's teams page: an admin sees every team, a team its own line; names are escaped."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.clock import WallClock
from broker.config.teams import FairShareConfig
from broker.intake import Intake
from broker.store import open_store
from broker.store.tables import JobRow
from broker.tokens import create_api_token
from policies.fair_share import Team


def _signed_in(app: object, token: str) -> TestClient:
    client = TestClient(app)  # type: ignore[arg-type]
    assert client.post("/login", data={"token": token}, follow_redirects=False).status_code == 303
    return client


def test_the_teams_page(db_url: str, broker_home: Path) -> None:
    store = open_store(db_url)
    now = datetime.now(UTC)
    hostile = "<script>alert(1)</script>"
    with store.transaction() as s:
        for job_id, team, state in (("j1", "alpha", "RUNNING"), ("j2", hostile, "PENDING"), ("j3", "beta", "PENDING")):
            s.add(JobRow(id=job_id, name=job_id, team=team, state=state, priority=500, spec={}, backend="local",
                         num_nodes=1, gpus_per_node=2, checkpoint_dir="/c", created_at=now, updated_at=now, zones=[],
                         reason="waiting: team beta over its share (holds 0 of 0 GPUs owed)" if team == "beta"
                         else None))
    config = FairShareConfig(teams=(Team("alpha", weight=2), Team("beta")), capacity_gpus=2)
    app = create_app(store, WallClock(), Intake(broker_home, "local", None), fair_share=config)
    admin = _signed_in(app, create_api_token(store, "admin").token)
    page = admin.get("/teams")
    assert page.status_code == 200
    assert "<td>alpha</td>" in page.text and "<td>beta</td>" in page.text and "Fleet: 2 GPUs" in page.text
    assert hostile not in page.text and "&lt;script&gt;" in page.text
    beta = _signed_in(app, create_api_token(store, "beta").token)
    own = beta.get("/teams").text
    assert "<td>beta</td>" in own and "<td>alpha</td>" not in own
    # The job page says why a job waits.
    assert "Why: waiting: team beta over its share" in beta.get("/jobs/j3").text
    store.dispose()
