"""Hostile and clumsy requests: each gets a 4xx naming what is wrong, never a 500, and stores nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from broker.api.app import create_app
from broker.api.limits import MAX_BODY_BYTES, JsonDepth, Limits, json_depth
from broker.clock import AcceleratedClock, WallClock
from broker.intake import Intake
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow, NoticeRow
from broker.tokens import token_digest
from tests.broker.api.conftest import JOB, Api


def _jobs(api: Api) -> int:
    with api.store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow)) or 0)


def _named(response: object, field: str) -> None:
    body = response.json()  # type: ignore[attr-defined]
    text = json.dumps(body)
    assert field in text, text
    assert "Traceback" not in text and "input" not in text


def _deep(levels: int) -> bytes:
    return b'{"spec": ' + b"[" * levels + b"]" * levels + b"}"


def test_json_depth_skips_brackets_inside_strings() -> None:
    assert json_depth(b'{"a": "[[[[{{{{", "b": [[1]]}') == 3
    assert json_depth(b'"\\"[[["') == 0


def test_json_depth_is_the_same_whatever_the_chunks() -> None:
    body = json.dumps({'a\\"[': ["\\", {"b": [['x\\"]', "\\\\"]]}], "c": "{{"}).encode()
    assert json_depth(body) == 5
    for size in (1, 2, 3, 7):
        depth = JsonDepth()
        for start in range(0, len(body), size):
            depth.feed(body[start:start + size])
        assert depth.deepest == 5, size


def test_json_depth_stops_where_a_parser_would() -> None:
    """A close with nothing open, or a backslash outside a string, is where any JSON parser stops,
    so the scan stops there too; up to that point depth is counted as usual."""
    assert json_depth(b"[[[]]]]" + b"[" * 100) == 3
    assert json_depth(b"[[\\" + b"[" * 100) == 2
    assert json_depth(b'["\\\\", [' + b"[" * 40) == 42  # an escaped backslash inside a string is not one


def test_a_body_of_escaped_quotes_is_scanned_in_linear_time() -> None:
    """The former pattern restarted at every quote: '"' and 32,000 '\\"' took 27 s, 2 MB would take
    hours. Run in a child process so a quadratic scan fails the test instead of hanging it."""
    import subprocess
    import sys

    script = ("from broker.api.limits import json_depth, MAX_BODY_BYTES\n"
              "n = MAX_BODY_BYTES // 2 - 1\n"
              "assert json_depth(b'\"' + b'\\\\\"' * n) == 0\n"
              "assert json_depth(b'{\"a\": \"' + b'\\\\\"' * n) == 1\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_without_a_token_an_api_call_is_401_before_its_body_is_read(api: Api) -> None:
    response = api.client.post("/v1/jobs", content=b'"' + b'\\"' * 32_000, headers={"Content-Type": "application/json"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["connection"] == "close"
    assert _jobs(api) == 0


def test_20000_deep_nesting_is_422_not_a_recursion_error(api: Api) -> None:
    response = api.client.post("/v1/jobs", content=_deep(20_000),
                               headers={**api.alpha, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body"]
    assert "deeper than 32" in response.json()["message"]
    assert _jobs(api) == 0


def test_a_body_of_many_small_arrays_is_422_before_it_is_parsed(api: Api) -> None:
    """400,000 arrays in 2 MB held the event loop for a second in validation after the depth check."""
    body = b'{"spec": [' + b"[]," * 10_001 + b"1]}"
    response = api.client.post("/v1/jobs", content=body, headers={**api.alpha, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body"]
    assert "more than 10000 arrays and objects" in response.json()["message"]
    assert _jobs(api) == 0


def test_a_body_over_the_size_limit_is_413(api: Api) -> None:
    big = json.dumps({"spec": "#" * (MAX_BODY_BYTES + 10)})
    response = api.client.post("/v1/jobs", content=big, headers={**api.alpha, "Content-Type": "application/json"})
    assert response.status_code == 413
    assert "larger than" in response.json()["message"]
    assert _jobs(api) == 0


def test_a_streamed_body_without_length_is_counted_too(api: Api) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"spec": "'
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"#" * 65536
        yield b'"}'

    response = api.client.post("/v1/jobs", content=chunks(), headers={**api.alpha, "Content-Type": "application/json"})
    assert response.status_code == 413
    assert _jobs(api) == 0


@pytest.mark.parametrize("field", ["spec", "source"])
def test_nul_in_a_body_string_is_422_naming_it(api: Api, field: str) -> None:
    body = {"spec": JOB, "source": "train.yaml"}
    body[field] = body[field] + "\x00"
    response = api.client.post("/v1/jobs", json=body, headers=api.alpha)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", field]
    assert "NUL" in response.json()["message"]
    assert _jobs(api) == 0


@pytest.mark.parametrize(("path", "words"), [
    ("/v1/jobs/j-%00", "path: contains a NUL"),
    ("/v1/jobs?state=RUN%00NING", "query parameter 'state'"),
    ("/v1/reports?since=7%00d", "query parameter 'since'"),
    ("/v1/jobs/j-1/logs?offset=a%00:1", "query parameter 'offset'"),
], ids=["job-id", "state", "since", "offset"])
def test_nul_in_ids_and_query_strings_is_400(api: Api, path: str, words: str) -> None:
    response = api.client.get(path, headers=api.alpha)
    assert response.status_code == 400
    assert words in response.json()["message"]


@pytest.mark.parametrize(("path", "field"), [
    ("/v1/jobs/" + "j" * 1000, "job_id"),
    ("/v1/jobs/j-1%20or%201", "job_id"),
    ("/v1/jobs?state=" + "R" * 500, "state"),
    ("/v1/reports?since=" + "9" * 500, "since"),
])
def test_overlong_ids_and_query_strings_are_422_naming_them(api: Api, path: str, field: str) -> None:
    response = api.client.get(path, headers=api.alpha)
    assert response.status_code == 422
    _named(response, field)


def test_an_url_over_8k_is_400(api: Api) -> None:
    response = api.client.get("/v1/jobs?state=" + "R" * 9000, headers=api.alpha)
    assert response.status_code == 400
    assert "URL" in response.json()["message"]


@pytest.mark.parametrize("since", ["99999999999d", "1e300d", "99999999999999999999999"])
def test_report_window_beyond_any_calendar_is_422(api: Api, since: str) -> None:
    response = api.client.get("/v1/reports", params={"since": since}, headers=api.alpha)
    assert response.status_code == 422
    assert "since" in response.json()["detail"]


@pytest.mark.parametrize("offset", ["attempt-1-node-0:" + "9" * 30, "attempt-1-node-0:" + "9" * 5000,
                                    "attempt-1-node-0:٣"])
def test_a_huge_or_foreign_log_offset_is_422(api: Api, offset: str) -> None:
    job_id = api.submit(api.alpha)
    response = api.client.get(f"/v1/jobs/{job_id}/logs", params={"offset": offset}, headers=api.alpha)
    assert response.status_code == 422
    assert response.json()["detail"].startswith("offset:")


@pytest.mark.parametrize(("extra", "field"), [
    ("broker:\n  deadline: 2030-13-45T00:00:00Z\n", "deadline"),
    ("broker:\n  deadline: 99999999999d\n", "deadline"),
    ("broker:\n  deadline: 9999-12-31T23:59:59Z\n", "deadline"),
    ("broker:\n  work: 99999999999d\n", "work"),
    ("broker:\n  priority: 100000000000000000000000\n", "priority"),
], ids=["month-13", "huge-duration", "year-9999", "huge-work", "priority-1e23"])
def test_garbage_in_the_broker_section_is_4xx_and_stores_nothing(api: Api, extra: str, field: str) -> None:
    # Naming the field is the job-file parser's part; the route's is that nothing it raises is a 500.
    response = api.client.post("/v1/jobs", json={"spec": JOB + extra}, headers=api.alpha)
    assert 400 <= response.status_code < 500, response.text
    assert "Traceback" not in response.text
    assert _jobs(api) == 0


def test_num_nodes_of_1e23_is_422(api: Api) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB.replace("num_nodes: 1", "num_nodes: " + "1" + "0" * 23)},
                               headers=api.alpha)
    assert response.status_code == 422, response.text
    _named(response, "num_nodes")
    assert _jobs(api) == 0


@pytest.mark.parametrize("value", [10**23, 1e23, -(10**23)])
def test_a_number_of_1e23_where_text_belongs_is_422(api: Api, value: float) -> None:
    response = api.client.post("/v1/jobs", json={"spec": value}, headers=api.alpha)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "spec"]


def test_a_job_name_over_200_characters_is_422_before_the_database(api: Api) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB.replace("name: train", "name: " + "n" * 201)},
                               headers=api.alpha)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][-1] == "name"
    assert _jobs(api) == 0


def test_nul_inside_the_job_file_is_4xx(api: Api) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB.replace("name: train", "name: tr\x00ain")},
                               headers=api.alpha)
    assert response.status_code == 422
    assert _jobs(api) == 0


@pytest.mark.parametrize("body", [b"{not json", _deep(20_000), b'{"spec": 1}', b"\x00\xff\xfe"],
                         ids=["not-json", "deep", "wrong-type", "binary"])
def test_without_a_token_a_malformed_submission_is_401_not_422(api: Api, body: bytes) -> None:
    for headers in ({}, {"Authorization": "Bearer bkr_nope"}):
        response = api.client.post("/v1/jobs", content=body, headers={**headers, "Content-Type": "application/json"})
        # depth is refused before any route runs; only a call without any token is refused before that
        expected = 422 if body == _deep(20_000) and headers else 401
        assert response.status_code == expected
        assert "loc" not in response.text or expected == 422
    assert _jobs(api) == 0


def test_an_overlong_or_nul_token_is_401(api: Api) -> None:
    for token in ("x" * 10_000, "bkr_\x00"):
        response = api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}".encode("latin-1")})  # type: ignore[dict-item]
        assert response.status_code == 401


def test_a_request_over_its_time_budget_is_503(db_url: str, broker_home: object) -> None:
    store = open_store(db_url)
    from pathlib import Path

    from broker.tokens import create_api_token

    app = create_app(store, WallClock(), Intake(Path(str(broker_home)), "local"), limits=Limits(time_budget_s=1e-6))
    token = create_api_token(store, "alpha").token
    response = TestClient(app).get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 503
    assert "budget" in response.json()["message"]


# --- notices -----------------------------------------------------------------------------------


@pytest.fixture
def notice_store(db_url: str) -> Store:
    store = open_store(db_url)
    now = datetime.now(UTC)
    with store.transaction() as s:
        s.add(JobRow(id="j1", name="t", team="a", state="RUNNING", priority=500, spec={}, backend="local",
                     num_nodes=1, gpus_per_node=1, checkpoint_dir="/ckpt/j1", created_at=now, updated_at=now,
                     zones=[]))
        s.flush()
        for cluster_id, token, state in (("c1", "token-one", "UP"), ("c9", "token-dead", "TERMINATED"),
                                         ("c8", "token-failed", "FAILED")):
            s.add(ClusterRow(id=cluster_id, launch_key=cluster_id, job_id="j1", backend="local", cloud="aws",
                             region="r", zone="z", instance_type="p3.2xlarge", gpus_per_node=1, num_nodes=1,
                             spot=True, price_per_node_hour=1.0, on_demand_price_per_node_hour=3.0, state=state,
                             token_hash=token_digest(token), handle={}, created_at=now))
    return store


def _notices(store: Store) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(NoticeRow)) or 0)


def _notice(**extra: object) -> dict[str, object]:
    return {"cluster_id": "c1", "node": "0", "kind": "terminate", "action_time": "2026-11-21T10:00:00Z", **extra}


ONE = {"Authorization": "Bearer token-one"}


@pytest.mark.parametrize(("field", "value"), [
    ("action_time", "9999-12-31T23:59:59Z"),
    ("checkpoint_at", "0001-01-01T00:00:00Z"),
    ("node", "n" * 101),
    ("cluster_id", "c" * 65),
    ("node", "0\x00"),
    ("cluster_id", "c1\x00"),
    ("checkpoint", "/ckpt/j1/step\x00-1"),
    ("kind", "terminate\x00"),
], ids=["year-9999", "year-1", "long-node", "long-cluster", "nul-node", "nul-cluster", "nul-checkpoint", "nul-kind"])
def test_malformed_notice_fields_are_422_naming_them(notice_store: Store, field: str, value: str) -> None:
    client = TestClient(create_app(notice_store, WallClock()))
    response = client.post("/v1/notices", json=_notice(**{field: value}), headers=ONE)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", field]
    assert _notices(notice_store) == 0


def test_an_action_time_the_accelerated_clock_cannot_hold_is_422(notice_store: Store) -> None:
    clock = AcceleratedClock.starting_now(1e6)
    client = TestClient(create_app(notice_store, clock))
    response = client.post("/v1/notices", json=_notice(action_time="2199-01-01T00:00:00Z"), headers=ONE)
    assert response.status_code == 422, response.text
    _named(response, "action_time")
    assert _notices(notice_store) == 0


@pytest.mark.parametrize("body", [b"{not json", b'{"cluster_id": "c1", "kind": "explode"}', b"[]", _deep(20_000)],
                         ids=["not-json", "bad-kind", "list", "deep"])
def test_an_unauthenticated_malformed_notice_is_401_without_schema_details(notice_store: Store, body: bytes) -> None:
    client = TestClient(create_app(notice_store, WallClock()))
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Bearer token-dead"}):
        response = client.post("/v1/notices", content=body, headers={**headers, "Content-Type": "application/json"})
        if body == _deep(20_000) and headers:
            assert response.status_code == 422  # refused before any route, for every token
            continue
        assert response.status_code == 401, response.text
        assert "loc" not in response.text and "kind" not in response.text
    assert _notices(notice_store) == 0


@pytest.mark.parametrize("token", ["token-dead", "token-failed"])
def test_a_terminated_clusters_token_is_refused(notice_store: Store, token: str) -> None:
    cluster = "c9" if token == "token-dead" else "c8"
    client = TestClient(create_app(notice_store, WallClock()))
    response = client.post("/v1/notices", json=_notice(cluster_id=cluster),
                           headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    assert _notices(notice_store) == 0


def test_a_token_stops_working_when_its_cluster_ends(notice_store: Store) -> None:
    client = TestClient(create_app(notice_store, WallClock()))
    assert client.post("/v1/notices", json=_notice(), headers=ONE).status_code == 202
    with notice_store.transaction() as s:
        s.get(ClusterRow, "c1").state = "TERMINATED"  # type: ignore[union-attr]
    assert client.post("/v1/notices", json=_notice(kind="rebalance"), headers=ONE).status_code == 401
    assert _notices(notice_store) == 1


@pytest.mark.parametrize("path", ["/etc/passwd", "/ckpt/j1/../../etc/passwd", "/ckpt/j10/step-1", "ckpt/j1/x",
                                  "s3://bucket/ckpt/j1", "/ckpt"])
def test_a_checkpoint_outside_the_jobs_dir_is_422(notice_store: Store, path: str) -> None:
    client = TestClient(create_app(notice_store, WallClock()))
    response = client.post("/v1/notices", json=_notice(checkpoint=path), headers=ONE)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "checkpoint"]
    assert _notices(notice_store) == 0


@pytest.mark.parametrize("path", ["/ckpt/j1/step-7", "/ckpt/j1", "/ckpt/j1/a/./b"])
def test_a_checkpoint_inside_the_jobs_dir_is_recorded(notice_store: Store, path: str) -> None:
    client = TestClient(create_app(notice_store, WallClock()))
    response = client.post("/v1/notices", json=_notice(checkpoint=path), headers=ONE)
    assert response.status_code == 202, response.text
    with notice_store.transaction() as s:
        assert s.scalar(select(NoticeRow.checkpoint)) == path


@pytest.mark.parametrize(("spec", "field"), [
    ('name: "bad\\ud800"\n' + JOB.split("\n", 1)[1], "name"),
    ('envs:\n  A: "x\\udfff"\n' + JOB, "envs.A"),
    (JOB.replace("  accelerators: V100:1\n", "  accelerators: V100:1\n  memory: .nan\n"), "resources.memory"),
    ("broker:\n  checkpoint:\n    dir: /" + "a" * 100_000 + "\n" + JOB, "broker.checkpoint.dir"),
], ids=["surrogate-name", "surrogate-env", "nan-memory", "long-dir"])
def test_values_no_field_may_hold_are_422_and_store_nothing(api: Api, spec: str, field: str) -> None:
    """Were a 500 (surrogate; NaN on PostgreSQL), or stored, launched, billed and FAILED (env, long dir)."""
    response = api.client.post("/v1/jobs", json={"spec": spec}, headers=api.alpha)
    assert response.status_code == 422, response.text
    _named(response, field)
    assert _jobs(api) == 0


@pytest.mark.parametrize("raw_source", ['"a\\u0000b"', '"x\\u001b[31mred"', '"line\\nbreak"', '"del\\u007f"',
                                        '"c1\\u0085"', '"\\ud800x"', '"x\\udfff"'])
def test_a_source_with_control_characters_or_surrogates_is_refused_and_nothing_stored(api: Api,
                                                                                     raw_source: str) -> None:
    body = ('{"spec": ' + json.dumps(JOB) + ', "source": ' + raw_source + "}").encode()
    response = api.client.post("/v1/jobs", content=body, headers={**api.alpha, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "source"]
    _named(response, "body.source")
    assert _jobs(api) == 0


@pytest.mark.parametrize("team", ["[/bold]", "[red]x", "a\x1b[31m", "a b"])
def test_a_job_file_team_with_markup_is_a_422_naming_it(api: Api, team: str) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB + f"broker:\n  team: {json.dumps(team)}\n"},
                               headers=api.alpha)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"][-2:] == ["broker", "team"]
    assert _jobs(api) == 0
