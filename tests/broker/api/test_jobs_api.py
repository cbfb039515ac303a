"""The /v1 API: every route with the caller's token, without one, and with another team's."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from broker.store.tables import JobRow, PolicyOverrideRow
from broker.tokens import create_api_token, revoke_api_token
from tests.broker.api.conftest import JOB, Api

NO_TOKEN: dict[str, str] = {}
BAD_TOKEN = {"Authorization": "Bearer bkr_not-a-token"}


def _jobs(api: Api) -> list[JobRow]:
    with api.store.transaction() as s:
        return list(s.scalars(select(JobRow)))


def test_submit_records_a_pending_job_for_the_tokens_team(api: Api) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB, "source": "/jobs/train.yaml"}, headers=api.alpha)
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == "PENDING" and body["team"] == "alpha" and body["name"] == "train"
    [job] = _jobs(api)
    assert (job.id, job.team, job.state, job.spec_path) == (body["job_id"], "alpha", "PENDING", "/jobs/train.yaml")


@pytest.mark.parametrize("headers", [NO_TOKEN, BAD_TOKEN, {"Authorization": "Basic abc"}], ids=["none", "bad", "basic"])
def test_submit_without_a_valid_token_is_401_and_writes_nothing(api: Api, headers: dict[str, str]) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB}, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert _jobs(api) == []


def test_a_revoked_token_is_401(api: Api) -> None:
    issued = create_api_token(api.store, "gamma")
    headers = {"Authorization": f"Bearer {issued.token}"}
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    assert revoke_api_token(api.store, issued.token_id)
    assert api.client.get("/v1/jobs", headers=headers).status_code == 401


def test_submit_for_another_team_is_403(api: Api) -> None:
    response = api.client.post("/v1/jobs", json={"spec": JOB + "broker:\n  team: beta\n"}, headers=api.alpha)
    assert response.status_code == 403
    assert "beta" in response.json()["detail"]
    assert _jobs(api) == []


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"spec": "name: t\nresources:\n  accelerators: V100:1\n"}, "run", "required"),
        ({"spec": JOB + "broker:\n  priority: urgent\n"}, "priority", "expected one of"),
        ({"spec": JOB.replace("V100:1", "V100:-1")}, "accelerators", "V100"),
        ({"spec": JOB + "colour: blue\n"}, "colour", "colour"),
        ({"spec": "run: [unclosed\n"}, "spec", "line"),
        ({"spec": JOB.replace("V100:1", "H100:8")}, "accelerators", "market has"),
        ({"spec": ""}, "spec", "at least 1 character"),
        ({"source": "x.yaml"}, "spec", "Field required"),
        ({"spec": 42}, "spec", "valid string"),
    ],
    ids=["missing-run", "bad-priority", "negative-gpus", "unknown-key", "yaml-syntax", "not-in-market", "empty",
         "no-spec", "not-a-string"],
)
def test_malformed_submissions_get_422_naming_the_field(api: Api, body: dict[str, object], field: str,
                                                         words: str) -> None:
    response = api.client.post("/v1/jobs", json=body, headers=api.alpha)
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert field in [str(part) for part in problem["loc"]]
    assert words.lower() in (problem["msg"] + response.json().get("message", "")).lower()
    assert _jobs(api) == []


def test_a_body_that_is_not_json_is_422(api: Api) -> None:
    response = api.client.post("/v1/jobs", content=b"name: t", headers={**api.alpha, "Content-Type": "text/yaml"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body"]


def test_each_team_lists_only_its_jobs(api: Api) -> None:
    mine = api.submit(api.alpha)
    theirs = api.submit(api.beta)
    assert [j["job_id"] for j in api.client.get("/v1/jobs", headers=api.alpha).json()] == [mine]
    assert [j["job_id"] for j in api.client.get("/v1/jobs", headers=api.beta).json()] == [theirs]
    assert api.client.get("/v1/jobs?state=running", headers=api.alpha).json() == []
    assert api.client.get("/v1/jobs", headers=NO_TOKEN).status_code == 401


def test_job_status_is_the_owners_only(api: Api) -> None:
    job_id = api.submit(api.alpha)
    own = api.client.get(f"/v1/jobs/{job_id}", headers=api.alpha)
    assert own.status_code == 200 and own.json()["job_id"] == job_id and own.json()["state"] == "PENDING"
    assert api.client.get(f"/v1/jobs/{job_id}", headers=api.beta).status_code == 403
    assert api.client.get(f"/v1/jobs/{job_id}", headers=NO_TOKEN).status_code == 401
    missing = api.client.get("/v1/jobs/j-nothere", headers=api.alpha)
    assert missing.status_code == 404 and "j-nothere" in missing.json()["detail"]


def test_only_the_owner_cancels(api: Api) -> None:
    job_id = api.submit(api.alpha)
    assert api.client.post(f"/v1/jobs/{job_id}/cancel", headers=api.beta).status_code == 403
    assert api.client.post(f"/v1/jobs/{job_id}/cancel", headers=NO_TOKEN).status_code == 401
    assert [j.state for j in _jobs(api)] == ["PENDING"]
    response = api.client.post(f"/v1/jobs/{job_id}/cancel", headers=api.alpha)
    assert response.status_code == 200 and response.json() == {"job_id": job_id, "state": "CANCELLED"}
    assert [j.state for j in _jobs(api)] == ["CANCELLED"]


def test_logs_are_read_from_the_offsets_given(api: Api) -> None:
    job_id = api.submit(api.alpha)
    directory = api.home / "logs" / job_id
    directory.mkdir(parents=True)
    (directory / "attempt-1-node-0.log").write_text("step 1\nstep 2\n")
    (directory / "attempt-2-node-0.log").write_text("resumed\n")
    first = api.client.get(f"/v1/jobs/{job_id}/logs", headers=api.alpha).json()
    assert [(c["file"], c["start"], c["text"]) for c in first["chunks"]] == [
        ("attempt-1-node-0", 0, "step 1\nstep 2\n"), ("attempt-2-node-0", 0, "resumed\n")]
    with (directory / "attempt-2-node-0.log").open("a") as handle:
        handle.write("step 3\n")
    offsets = [f"{c['file']}:{c['end']}" for c in first["chunks"]]
    second = api.client.get(f"/v1/jobs/{job_id}/logs", params={"offset": offsets}, headers=api.alpha).json()
    assert [(c["file"], c["text"]) for c in second["chunks"]] == [("attempt-2-node-0", "step 3\n")]
    assert api.client.get(f"/v1/jobs/{job_id}/logs", headers=api.beta).status_code == 403
    assert api.client.get(f"/v1/jobs/{job_id}/logs", headers=NO_TOKEN).status_code == 401
    bad = api.client.get(f"/v1/jobs/{job_id}/logs", params={"offset": "nonsense"}, headers=api.alpha)
    assert bad.status_code == 422 and "FILE:BYTES" in bad.json()["detail"]


def test_a_queue_priority_in_force_applies_to_new_jobs(api: Api) -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 1, 1, 8, tzinfo=UTC)
    with api.store.transaction() as s:
        s.add(PolicyOverrideRow(key="queue_priority:training", value=250, schedule="night", fire_time=now,
                                applied_at=now))
    training = api.submit(api.alpha)
    inference = api.submit(api.alpha, JOB + "broker:\n  priority: inference\n")
    with api.store.transaction() as s:
        assert s.get(JobRow, training).priority == 250  # type: ignore[union-attr]
        assert s.get(JobRow, inference).priority == 1000  # type: ignore[union-attr]
        assert s.scalar(select(func.count()).select_from(JobRow)) == 2


def test_openapi_document_lists_the_v1_routes(api: Api) -> None:
    paths = set(api.client.get("/openapi.json").json()["paths"])
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/logs", "/v1/prices",
            "/v1/reports", "/v1/notices", "/v1/health", "/v1/pipelines"} <= paths


@pytest.mark.parametrize(("accelerators", "status"), [("A100:0.5", 201), ("A100:1", 201), ("H100:0.5", 422)])
def test_a_share_of_a_gpu_fits_a_node_of_any_size_of_that_gpu(api: Api, accelerators: str, status: int) -> None:
    # The market sells A100 only in nodes of 8: half of one of them is on offer, and so is one whole A100
    # per node (the engine places a gang on nodes bigger than it asks, their other GPUs left to others).
    response = api.client.post("/v1/jobs", json={"spec": JOB.replace("V100:1", accelerators)}, headers=api.alpha)
    assert response.status_code == status, response.text
    assert len(_jobs(api)) == (1 if status == 201 else 0)


def test_an_expired_token_is_401_like_a_revoked_one(api: Api) -> None:
    from datetime import timedelta

    from broker.tokens import extend_api_token, team_of_token

    issued = create_api_token(api.store, "gamma", timedelta(hours=1))
    headers = {"Authorization": f"Bearer {issued.token}"}
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    extend_api_token(api.store, issued.token_id, timedelta(seconds=-1))  # its end has passed
    refused = api.client.post("/v1/jobs", json={"spec": JOB}, headers=headers)
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    assert team_of_token(api.store, issued.token) is None and _jobs(api) == []
    extend_api_token(api.store, issued.token_id, timedelta(hours=1))  # renewed: valid again
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    revoke_api_token(api.store, issued.token_id)
    extend_api_token(api.store, issued.token_id, timedelta(hours=1))  # a revoked token stays revoked
    assert api.client.get("/v1/jobs", headers=headers).status_code == 401
