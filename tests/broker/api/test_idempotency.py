"""``Idempotency-Key`` on job submission: a retried POST with the same key gets the same job, never two;
keys are the team's, kept a day, and a key that is not one is a 400 naming the header."""

from __future__ import annotations

import http.client
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select, update

from broker.api.app import BackgroundServer
from broker.store.submissions import IdempotencyKeyRow
from broker.store.tables import JobRow
from tests.broker.api.conftest import JOB, Api

PIPELINE = "name: etl\n---\n" + JOB.replace("name: train", "name: prep") + "---\n" + JOB


def _count(api: Api, table: type = JobRow) -> int:
    with api.store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(table)) or 0)


def _post(api: Api, headers: dict[str, str], key: str | None, text: str = JOB, route: str = "/v1/jobs") -> object:
    keyed = {**headers, **({"Idempotency-Key": key} if key is not None else {})}
    return api.client.post(route, json={"spec": text}, headers=keyed)


def test_a_retry_with_the_same_key_gets_the_same_job(api: Api) -> None:
    first = _post(api, api.alpha, "4f1c0c3e-retry")
    again = _post(api, api.alpha, "4f1c0c3e-retry")
    assert first.status_code == again.status_code == 201, again.text  # type: ignore[attr-defined]
    assert first.json()["job_id"] == again.json()["job_id"]  # type: ignore[attr-defined]
    assert again.headers["Idempotent-Replayed"] == "true"  # type: ignore[attr-defined]
    assert "Idempotent-Replayed" not in first.headers  # type: ignore[attr-defined]
    assert _count(api) == 1
    other = _post(api, api.alpha, "another-key")  # a new key is a new job; no key, too
    unkeyed = _post(api, api.alpha, None)
    assert len({first.json()["job_id"], other.json()["job_id"], unkeyed.json()["job_id"]}) == 3  # type: ignore[attr-defined]


def test_keys_are_the_teams_own(api: Api) -> None:
    alpha = _post(api, api.alpha, "same-key")
    beta = _post(api, api.beta, "same-key")
    assert alpha.status_code == beta.status_code == 201  # type: ignore[attr-defined]
    assert alpha.json()["job_id"] != beta.json()["job_id"] and beta.json()["team"] == "beta"  # type: ignore[attr-defined]
    assert _count(api) == 2


def test_the_same_key_with_another_job_file_is_refused_and_nothing_is_stored(api: Api) -> None:
    assert _post(api, api.alpha, "k1").status_code == 201  # type: ignore[attr-defined]
    changed = _post(api, api.alpha, "k1", JOB.replace("train", "other"))
    assert changed.status_code == 422 and "Idempotency-Key" in changed.json()["detail"]  # type: ignore[attr-defined]
    pipeline = _post(api, api.alpha, "k1", PIPELINE, route="/v1/pipelines")  # another route is another request
    assert pipeline.status_code == 422  # type: ignore[attr-defined]
    assert _count(api) == 1


@pytest.mark.parametrize("key", ["", " ", "a b", "x" * 256, "caf\u00e9", "tab\there", "\x7f"])
def test_a_key_that_is_not_one_is_a_400_naming_the_header(api: Api, key: str) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB},
                               headers={**api.alpha, "Idempotency-Key": key.encode("latin-1")})  # type: ignore[dict-item]
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["detail"], response.text
    assert _count(api) == 0 and _count(api, IdempotencyKeyRow) == 0


def test_two_keys_in_one_request_are_a_400(api: Api) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB},
                               headers=[*api.alpha.items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["detail"]
    assert _count(api) == 0


def test_a_key_older_than_a_day_is_forgotten(api: Api) -> None:
    first = _post(api, api.alpha, "old-key")
    with api.store.transaction() as s:
        s.execute(update(IdempotencyKeyRow).values(created_at=datetime.now(UTC) - timedelta(days=1, seconds=1)))
    again = _post(api, api.alpha, "old-key")
    assert again.json()["job_id"] != first.json()["job_id"]  # type: ignore[attr-defined]
    assert _count(api) == 2 and _count(api, IdempotencyKeyRow) == 1


def test_a_retried_pipeline_gets_the_same_stages(api: Api) -> None:
    first = _post(api, api.alpha, "p-key", PIPELINE, route="/v1/pipelines")
    again = _post(api, api.alpha, "p-key", PIPELINE, route="/v1/pipelines")
    assert first.status_code == again.status_code == 201, again.text  # type: ignore[attr-defined]
    assert again.json() == first.json() | {"stages": again.json()["stages"]}  # type: ignore[attr-defined]
    assert again.json()["name"] == "etl" and again.json()["kind"] == "chain"  # type: ignore[attr-defined]
    assert _count(api) == 2


def test_retries_racing_each_other_store_one_job(api: Api) -> None:
    server = BackgroundServer(api.client.app).start()  # type: ignore[arg-type]
    deadline = time.time() + 60
    while not server.server.started and time.time() < deadline:
        time.sleep(0.05)
    parts = urlsplit(server.url)
    answers: list[tuple[int, str]] = []
    start = threading.Barrier(8)

    def send() -> None:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
        start.wait()
        conn.request("POST", "/v1/jobs", body=json.dumps({"spec": JOB}),
                     headers={**api.alpha, "Content-Type": "application/json", "Idempotency-Key": "raced"})
        response = conn.getresponse()
        answers.append((response.status, json.loads(response.read())["job_id"]))
        conn.close()

    threads = [threading.Thread(target=send) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        server.stop()
    assert len(answers) == 8 and {status for status, _ in answers} == {201}
    assert len({job_id for _, job_id in answers}) == 1
    assert _count(api) == 1


def test_fuzzed_keys_are_a_job_once_or_a_400_naming_the_header(api: Api) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(key=st.one_of(st.text(alphabet=st.characters(min_codepoint=1, max_codepoint=255), max_size=300),
                         st.sampled_from(["\x00", "a" * 255, "a" * 256, "\ud800", "\r\n"])))
    def send(key: str) -> None:
        try:
            raw = key.encode("latin-1")
        except UnicodeEncodeError:
            raw = key.encode("utf-8", "surrogatepass")
        if b"\r" in raw or b"\n" in raw or b"\x00" in raw:
            return  # no HTTP client sends these in a header; the server's parser refuses them itself
        before = _count(api)
        answers = [api.client.post("/v1/jobs", json={"spec": JOB}, headers={**api.alpha, "Idempotency-Key": raw})
                   for _ in range(2)]  # type: ignore[dict-item]
        codes = {answer.status_code for answer in answers}
        assert codes in ({201}, {400}), [a.text for a in answers]
        if codes == {400}:
            assert all("Idempotency-Key" in a.json()["detail"] for a in answers)
            assert _count(api) == before
        else:
            assert answers[0].json()["job_id"] == answers[1].json()["job_id"] and _count(api) == before + 1

    send()
