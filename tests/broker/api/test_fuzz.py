"""Fuzzing ``POST /v1/jobs`` and ``POST /v1/notices`` against the real app: no 5xx, nothing stored
for a refused body, memory bounded."""

from __future__ import annotations

import json
import resource
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from broker.api.app import create_app
from broker.clock import WallClock
from broker.intake import Intake
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow, NoticeRow
from broker.tokens import create_api_token, token_digest
from tests.broker.api.conftest import JOB, Api

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=300))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                           max_leaves=20)
hostile_text = st.one_of(st.text(max_size=300), st.just("\x00"), st.just("n" * 5000), st.just("9" * 400),
                         st.sampled_from(["9999-12-31T23:59:59Z", "2030-13-45T00:00:00Z", "99999999999d", "1e23",
                                          "-1", "NaN", "../../etc/passwd", "*a", "&a [*a, *a]", "{{{{", "]]]"]))
yaml_lines = st.sampled_from(["name: x", "num_nodes: 100000000000000000000000", "num_nodes: -1", "run: |",
                              "broker:", "  priority: 100000000000000000000000", "  deadline: 2030-13-45T00:00:00Z",
                              "  deadline: 99999999999d", "  work: 99999999999d", "envs:", "  A: 1",
                              "resources:", "  accelerators: V100:1", "  accelerators: V100:100000000000000",
                              "- - - -", "&a [1]", "*a", "\t", "name: " + "n" * 300, "  checkpoint:",
                              "    dir: /tmp/\x00"])
job_files = st.one_of(
    st.lists(st.one_of(yaml_lines, hostile_text), max_size=12).map("\n".join),
    st.tuples(st.just(JOB), st.lists(yaml_lines, max_size=4)).map(lambda t: t[0] + "\n".join(t[1])),
)
job_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"spec": job_files}, optional={"source": hostile_text}),
    st.fixed_dictionaries({"spec": json_values}),
)
notice_fields = {"node": hostile_text,
                 "kind": st.one_of(st.just("terminate"), hostile_text), "action_time": hostile_text,
                 "noticed_at": hostile_text, "checkpoint": st.one_of(st.just("/ckpt/j1/step-1"), hostile_text),
                 "checkpoint_at": hostile_text}
notice_bodies = st.one_of(json_values, st.fixed_dictionaries(
    {"cluster_id": st.one_of(st.just("c1"), hostile_text)}, optional=notice_fields))


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _count(store: Store, table: type) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(table)) or 0)


@pytest.fixture
def offline_api(db_url: str, broker_home: Path) -> Api:
    """The service API validating against the built-in catalog (no SkyPilot catalog load per run)."""
    store = open_store(db_url)
    intake = Intake(broker_home, "local", frozenset({("V100", 1), ("A100", 8)}), offline=True)
    alpha = create_api_token(store, "alpha").token
    return Api(TestClient(create_app(store, WallClock(), intake)), store, broker_home,
               {"Authorization": f"Bearer {alpha}"}, {})


def test_fuzzed_job_submissions_never_5xx_and_store_only_accepted_jobs(offline_api: Api) -> None:
    api = offline_api
    before = _max_rss_mb()

    @FUZZ
    @given(body=job_bodies)
    def submit(body: object) -> None:
        stored = _count(api.store, JobRow)
        for headers in (api.alpha, {}):
            response = api.client.post("/v1/jobs", content=json.dumps(body), headers={
                **headers, "Content-Type": "application/json"})
            assert response.status_code < 500, response.text
            assert "Traceback" not in response.text
            if not headers:
                assert response.status_code == 401
            stored += response.status_code == 201
            assert _count(api.store, JobRow) == stored

    submit()
    assert _max_rss_mb() - before < 300


@pytest.fixture
def notice_store(db_url: str) -> Store:
    store = open_store(db_url)
    now = datetime.now(UTC)
    with store.transaction() as s:
        s.add(JobRow(id="j1", name="t", team="a", state="RUNNING", priority=500, spec={}, backend="local",
                     num_nodes=1, gpus_per_node=1, checkpoint_dir="/ckpt/j1", created_at=now, updated_at=now,
                     zones=[]))
        s.flush()
        s.add(ClusterRow(id="c1", launch_key="c1", job_id="j1", backend="local", cloud="aws", region="r", zone="z",
                         instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1, spot=True,
                         price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state="UP",
                         token_hash=token_digest("token-one"), handle={}, created_at=now))
    return store


def test_fuzzed_notices_never_5xx_and_store_only_accepted_ones(notice_store: Store) -> None:
    client = TestClient(create_app(notice_store, WallClock()))
    before = _max_rss_mb()

    @FUZZ
    @given(body=notice_bodies)
    def post(body: object) -> None:
        stored = _count(notice_store, NoticeRow)
        for headers in ({"Authorization": "Bearer token-one"}, {"Authorization": "Bearer nope"}):
            response = client.post("/v1/notices", content=json.dumps(body), headers={
                **headers, "Content-Type": "application/json"})
            assert response.status_code < 500, response.text
            if headers["Authorization"] == "Bearer nope":
                assert response.status_code == 401
            elif response.status_code != 202 or response.json()["duplicate"]:
                assert _count(notice_store, NoticeRow) == stored
            else:
                assert _count(notice_store, NoticeRow) == stored + 1
            stored = _count(notice_store, NoticeRow)

    post()
    assert _max_rss_mb() - before < 300


def test_a_billion_laughs_job_file_is_422_and_memory_stays_bounded(offline_api: Api) -> None:
    lines = ["name: t", "run: 'true'", "envs:", '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    before = _max_rss_mb()
    response = offline_api.client.post("/v1/jobs", json={"spec": "\n".join(lines) + "\n"}, headers=offline_api.alpha)
    assert response.status_code == 422
    assert "envs" in response.json()["detail"][0]["loc"]
    assert _max_rss_mb() - before < 100
    assert _count(offline_api.store, JobRow) == 0
