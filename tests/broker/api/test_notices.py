from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from broker.api.app import create_app
from broker.clock import WallClock
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow, NoticeRow
from broker.tokens import token_digest


@pytest.fixture
def store(db_url: str) -> Store:
    store = open_store(db_url)
    now = datetime.now(UTC)
    with store.transaction() as s:
        s.add(JobRow(id="j1", name="t", team="a", state="RUNNING", priority=500, spec={}, backend="local",
                     num_nodes=1, gpus_per_node=1, checkpoint_dir="/c", created_at=now, updated_at=now, zones=[]))
        s.flush()
        for cluster_id, token in (("c1", "token-one"), ("c2", "token-two")):
            s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, job_id="j1", backend="local", cloud="aws",
                             region="r", zone="z", instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1,
                             spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP",
                             token_hash=token_digest(token), handle={}, created_at=now))
    return store


def _notice(cluster: str = "c1", **extra: object) -> dict[str, object]:
    return {"cluster_id": cluster, "node": "0", "kind": "terminate", "action_time": "2026-11-21T10:00:00Z", **extra}


def _count(store: Store) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(NoticeRow)) or 0)


def test_notice_needs_a_token(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    assert client.post("/v1/notices", json=_notice()).status_code == 401
    assert client.post("/v1/notices", json=_notice(), headers={"Authorization": "Bearer nope"}).status_code == 401
    assert _count(store) == 0


def test_forged_notice_for_another_cluster_is_refused(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    response = client.post("/v1/notices", json=_notice("c2"), headers={"Authorization": "Bearer token-one"})
    assert response.status_code == 403
    assert _count(store) == 0


def test_duplicate_notice_recorded_once_and_checkpoint_added(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    auth = {"Authorization": "Bearer token-one"}
    first = client.post("/v1/notices", json=_notice(), headers=auth)
    again = client.post("/v1/notices", json=_notice(node="1"), headers=auth)
    later = client.post("/v1/notices", json=_notice(checkpoint="/c/step-7", checkpoint_at="2026-11-21T09:59:00Z"),
                        headers=auth)
    assert first.status_code == 202 and first.json()["duplicate"] is False
    assert again.json() == {"notice_id": first.json()["notice_id"], "duplicate": True}
    assert later.json()["duplicate"] is True
    assert _count(store) == 1
    with store.transaction() as s:
        notice = s.scalar(select(NoticeRow))
        assert notice is not None and notice.checkpoint == "/c/step-7"
        assert notice.action_time == datetime(2026, 11, 21, 10, tzinfo=UTC)


def test_malformed_notice_gets_422_naming_the_field(store: Store) -> None:
    client = TestClient(create_app(store, WallClock()))
    response = client.post("/v1/notices", json=_notice(kind="explode"), headers={"Authorization": "Bearer token-one"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][-1] == "kind"
