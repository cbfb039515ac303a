"""``GET /v1/jobs`` a page at a time: stable while jobs are added, hostile page sizes and cursors refused
with a 422 naming the parameter, and the CLI's client reading every page."""

from __future__ import annotations

import time

import pytest

from broker.api.app import BackgroundServer
from broker.cli.client import BrokerClient
from tests.broker.api.conftest import Api


def _page(api: Api, **params: object) -> tuple[list[str], str | None]:
    response = api.client.get("/v1/jobs", params=params, headers=api.alpha)
    assert response.status_code == 200, response.text
    return [j["job_id"] for j in response.json()], response.headers.get("X-Next-After")


def test_paging_lists_every_job_once_in_order_while_jobs_are_added(api: Api) -> None:
    first = [api.submit(api.alpha) for _ in range(5)]
    page, more = _page(api, limit=2)
    assert page == first[:2] and more == first[1]
    added = [api.submit(api.alpha) for _ in range(2)]  # arriving between pages: they come last
    seen = list(page)
    while more is not None:
        page, more = _page(api, limit=2, after=more)
        seen += page
    assert seen == first + added
    assert _page(api)[0] == first + added  # one default page holds them all
    assert _page(api, limit=3, after=first[-1], state="pending")[0] == added


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": 0}, "limit"), ({"limit": -1}, "limit"), ({"limit": 1001}, "limit"), ({"limit": "ten"}, "limit"),
    ({"limit": 10**30}, "limit"), ({"limit": "nan"}, "limit"), ({"after": "../etc"}, "after"),
    ({"after": "j-" * 20}, "after"), ({"after": "j-\x00"}, "after"), ({"after": "j-00000000"}, "after"),
])
def test_hostile_page_sizes_and_cursors_are_422_naming_the_parameter(api: Api, params: dict[str, object],
                                                                      field: str) -> None:
    api.submit(api.alpha)
    response = api.client.get("/v1/jobs", params=params, headers=api.alpha)
    assert 400 <= response.status_code < 500
    assert field in response.text or "NUL" in response.text, response.text


@pytest.mark.parametrize("raw", ["after=j-%ED%A0%80", "after=%FF%FE", "limit=%00", "limit=1e3", "limit=5&limit=x"])
def test_undecodable_cursors_and_sizes_are_4xx(api: Api, raw: str) -> None:
    response = api.client.get(f"/v1/jobs?{raw}", headers=api.alpha)
    assert 400 <= response.status_code < 500, response.text


def test_a_cursor_of_another_teams_job_is_refused(api: Api) -> None:
    theirs = api.submit(api.beta)
    response = api.client.get("/v1/jobs", params={"after": theirs}, headers=api.alpha)
    assert response.status_code == 422
    assert "after" in response.text


def test_the_cli_client_reads_every_page(api: Api) -> None:
    submitted = [api.submit(api.alpha) for _ in range(5)]
    server = BackgroundServer(api.client.app).start()  # type: ignore[arg-type]
    deadline = time.monotonic() + 30
    while not server.server.started and time.monotonic() < deadline:
        time.sleep(0.01)  # until uvicorn listens
    try:
        with BrokerClient(server.url, api.alpha["Authorization"].split()[1]) as client:
            assert [j["job_id"] for j in client.jobs(page=2)] == submitted
    finally:
        server.stop()
