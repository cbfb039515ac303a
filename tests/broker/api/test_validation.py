"""A lone surrogate escaped in a JSON body (``"\\ud800"``), which pydantic's JSON parser refuses for the
whole body: refused naming the field that holds it, on every route that reads a body, nothing stored."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from broker.api.app import create_app
from broker.clock import WallClock
from broker.store import Store
from broker.store.submissions import IdempotencyKeyRow
from broker.store.tables import JobRow, NoticeRow
from tests.broker.api.conftest import JOB, Api
from tests.broker.api.test_hostile_input import ONE, notice_store  # noqa: F401  (a fixture)

SURROGATE = "\\ud800"  # as the JSON escape, six characters, written into the body's text


def _post(client: TestClient, path: str, body_text: str, headers: dict[str, str]) -> tuple[int, list[object], str]:
    response = client.post(path, content=body_text.encode(), headers={**headers, "Content-Type": "application/json"})
    detail = response.json().get("detail")
    return response.status_code, detail[0]["loc"] if isinstance(detail, list) else [], response.text


def _count(store: Store, table: type) -> int:
    with store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(table)) or 0)


def _spec(text: str) -> str:
    """``{"spec": text}`` with each ``@`` in ``text`` written as the escaped lone surrogate."""
    return '{"spec": ' + json.dumps(text).replace("@", SURROGATE) + "}"


@pytest.mark.parametrize(("body", "loc"), [
    ('{"spec": ' + json.dumps(JOB) + ', "source": "bad' + SURROGATE + '"}', ["body", "source"]),
    ('{"spec": ' + json.dumps(JOB) + ', "source": "' + SURROGATE + 'x"}', ["body", "source"]),
    (_spec(JOB.replace("name: train", "name: bad@")), ["body", "spec", "name"]),
    (_spec(JOB + "broker:\n  team: t@\n"), ["body", "spec", "broker", "team"]),
    (_spec(JOB + "broker:\n  checkpoint:\n    dir: /ckpt/@\n"), ["body", "spec", "broker", "checkpoint", "dir"]),
    (_spec(JOB + "envs:\n  A: x@\n"), ["body", "spec", "envs", "A"]),
    (_spec(JOB + "envs:\n  A: ok\n  B: \"@\"\n"), ["body", "spec", "envs", "B"]),
    (_spec(JOB + "setup: |\n  echo @\n"), ["body", "spec", "setup"]),
    ('{"spec": ' + json.dumps(JOB) + ', "x' + SURROGATE + '": 1}', ["body"]),  # a key: its object is named
    ('{"spec": ["' + SURROGATE + '"]}', ["body", "spec", 0]),
], ids=["source", "source-leading", "name", "team", "checkpoint-dir", "env-value", "second-env", "setup",
        "key", "in-a-list"])
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/pipelines"])
def test_a_lone_surrogate_in_a_submission_is_refused_naming_its_field(api: Api, path: str, body: str,
                                                                      loc: list[object]) -> None:
    status, where, text = _post(api.client, path, body, {**api.alpha, "Idempotency-Key": "k1"})
    assert status == 422, text
    assert where == loc, text
    assert "lone surrogate" in text and "Traceback" not in text
    assert _count(api.store, JobRow) == 0 and _count(api.store, IdempotencyKeyRow) == 0


def test_an_escaped_pair_is_one_character_and_accepted(api: Api) -> None:
    """A surrogate pair escaped in JSON is a character like any other, not a lone surrogate."""
    status, _, text = _post(api.client, "/v1/jobs", _spec(JOB.replace("name: train", "name: t\\ud83d\\ude80"))
                            .replace("\\\\ud83d", "\\ud83d").replace("\\\\ude80", "\\ude80"), api.alpha)
    assert status == 201, text
    with api.store.transaction() as s:
        assert s.scalar(select(JobRow.name)) == "t\U0001f680"


@pytest.mark.parametrize("field", ["cluster_id", "node", "kind", "checkpoint"])
def test_a_lone_surrogate_in_a_notice_is_refused_naming_its_field(notice_store: Store, field: str) -> None:  # noqa: F811
    client = TestClient(create_app(notice_store, WallClock()))
    notice = {"cluster_id": "c1", "node": "0", "kind": "terminate", "action_time": "2026-11-21T10:00:00Z",
              "checkpoint": "/ckpt/j1/step-1"}
    notice[field] = notice[field] + "@"
    status, where, text = _post(client, "/v1/notices", json.dumps(notice).replace("@", SURROGATE), ONE)
    assert (status, where) == (422, ["body", field]), text
    assert _count(notice_store, NoticeRow) == 0


def test_a_body_python_reads_but_json_does_not_keeps_its_first_refusal(api: Api) -> None:
    """``NaN`` and a truncated body are refused as before: not JSON, naming the body."""
    for body in ('{"spec": NaN, "source": "' + SURROGATE + '"}', '{"spec": "' + SURROGATE):
        status, where, text = _post(api.client, "/v1/jobs", body, api.alpha)
        assert (status, where) == (422, ["body"]), text
        assert "Invalid JSON" in text
    assert _count(api.store, JobRow) == 0
