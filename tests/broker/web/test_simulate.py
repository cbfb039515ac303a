"""The Simulate page: every policy on a bundled or uploaded trace; hostile uploads get one clear 4xx."""

from __future__ import annotations

import pytest

from broker.web.simulate import EXAMPLE_JOB, MAX_FORM_BYTES
from tests.broker.web.conftest import Dashboard

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def _post(dashboard: Dashboard, fields: dict[str, str]) -> tuple[int, str]:
    response = dashboard.signed_in("alpha").post("/simulate", data=fields)
    return response.status_code, response.text


@pytest.mark.slow
def test_each_policy_runs_on_the_bundled_market(dashboard: Dashboard) -> None:
    status, html = _post(dashboard, {"market": "quickstart", "job": EXAMPLE_JOB})
    assert status == 200, html[-2000:]
    for policy in ("broker", "on_demand", "optimal"):
        assert f"<td>{policy}</td>" in html
    assert 'class="timeline sim"' in html and "<rect" in html


@pytest.mark.slow
def test_an_uploaded_garbage_trace_is_one_422_naming_the_trace(dashboard: Dashboard) -> None:
    status, html = _post(dashboard, {"market": "upload", "trace": "time,cloud\n\xff\xfe,,,\n" * 50,
                                     "job": EXAMPLE_JOB})
    assert status == 422 and "market:" in html and "Traceback" not in html


@pytest.mark.parametrize(("fields", "field"), [
    ({"market": "quickstart", "job": "name: x\x00"}, "job:"),
    ({"market": "upload", "trace": "a,b\x00", "job": EXAMPLE_JOB}, "trace:"),
    ({"market": "upload", "trace": "", "job": EXAMPLE_JOB}, "trace:"),
    ({"market": "../../etc/passwd", "job": EXAMPLE_JOB}, "market:"),
    ({"market": "quickstart", "job": "   "}, "job:"),
])
def test_hostile_forms_are_refused_before_simulating(dashboard: Dashboard, fields: dict[str, str], field: str) -> None:
    status, html = _post(dashboard, fields)
    assert status == 400 and field in html


def test_a_huge_upload_is_413_without_reading_it_all(dashboard: Dashboard) -> None:
    client = dashboard.signed_in("alpha")
    body = b"market=upload&trace=" + b"9" * (MAX_FORM_BYTES + 1)
    response = client.post("/simulate", content=body, headers=FORM)
    assert response.status_code == 413 and "upload:" in response.text


def test_a_form_that_is_not_utf8_is_400(dashboard: Dashboard) -> None:
    response = dashboard.signed_in("alpha").post("/simulate", content=b"job=\xff\xfe", headers=FORM)
    assert response.status_code == 400
