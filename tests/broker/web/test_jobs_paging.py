"""The Jobs page a page at a time: a "next" link carrying the last row's job as the cursor, in every sort,
listing every job once; hostile cursors, and another team's job as one, are one clear 400."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert

from broker.store.tables import JobRow
from broker.web.jobs import PAGE_SIZE
from tests.broker.web.conftest import Dashboard

EXTRA = PAGE_SIZE + 37


def _add_jobs(dashboard: Dashboard) -> set[str]:
    t0 = datetime(2026, 2, 1, tzinfo=UTC)
    rows = [{"id": f"j-page{i:04d}", "name": f"sweep-{i % 7}", "team": "alpha", "state": "PENDING",
             "priority": 100 * (i % 3), "spec": {}, "backend": "local", "num_nodes": 1, "gpus_per_node": 1,
             "checkpoint_dir": "/c", "zones": [], "created_at": t0 + timedelta(seconds=i // 2),  # ties
             "updated_at": t0} for i in range(EXTRA)]
    with dashboard.store.transaction() as s:
        s.execute(insert(JobRow), rows)
    return {str(row["id"]) for row in rows}


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)"', html)


@pytest.mark.parametrize(("sort", "order"), [("submitted", "desc"), ("name", "asc"), ("priority", "desc"),
                                             ("cost", "desc")])
def test_next_links_list_every_job_once(dashboard: Dashboard, sort: str, order: str) -> None:
    added = _add_jobs(dashboard)
    alpha = dashboard.signed_in("alpha")
    everything = _ids(alpha.get("/jobs", params={"sort": sort, "order": order}).text)
    assert len(everything) == PAGE_SIZE
    seen: list[str] = []
    params = {"sort": sort, "order": order}
    for _ in range(5):
        html = alpha.get("/jobs", params=params).text
        seen += _ids(html)
        found = re.search(r'href="/jobs\?([^"]+)" rel="next"', html)
        if found is None:
            break
        params = dict(pair.split("=", 1) for pair in found.group(1).replace("&amp;", "&").split("&"))
    assert len(seen) == len(set(seen)) and added <= set(seen)
    assert dashboard.jobs["beta"] not in seen


@pytest.mark.parametrize("after", ["../etc", "j-" * 20, "j-nobody", "<script>"])
def test_hostile_cursors_are_one_clear_400(dashboard: Dashboard, after: str) -> None:
    response = dashboard.signed_in("alpha").get("/jobs", params={"after": after})
    assert response.status_code == 400 and "after:" in response.text


def test_another_teams_job_is_no_cursor(dashboard: Dashboard) -> None:
    response = dashboard.signed_in("alpha").get("/jobs", params={"after": dashboard.jobs["beta"]})
    assert response.status_code == 400 and "after:" in response.text
