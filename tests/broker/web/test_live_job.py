"""A job launched through the API of a real `broker serve`, watched in headless Chromium.

The job list is opened once: the job appears and its state changes without a reload; its page's
timeline then shows the preemption notice and the migration to the other zone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.store import open_store
from broker.tokens import create_api_token
from providers.base import SpotQuote
from providers.trace import write_trace
from tests.broker.service.replicas import ROOT, Replica, start_replica, wait_for
from tests.broker.web.conftest import Tab

JOB = """\
name: watched
num_nodes: 1
resources:
  accelerators: V100:1
workdir: {workdir}
run: python train.py --steps 3000 --step-seconds 0.05 --checkpoint-every 40
"""


def alternating_trace(path: Path, ticks: int = 600, half: int = 12) -> Path:
    """A V100 market whose two zones take turns: aws us-east-1a (cheap) then gcp us-central1-a, ``half`` minutes each.

    Wherever and whenever the job starts, its zone loses its capacity within ``2 * half`` minutes.
    """
    start = datetime(2026, 1, 1, tzinfo=UTC)
    quotes = []
    for tick in range(ticks):
        when = start + timedelta(minutes=tick)
        aws_up = (tick // half) % 2 == 0
        quotes.append(SpotQuote("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 0.9, 3.06, when,
                                available_nodes=2 if aws_up else 0))
        quotes.append(SpotQuote("gcp", "us-central1", "us-central1-a", "n1-highmem-8", "V100", 1, 1.0, 2.95, when,
                                available_nodes=0 if aws_up else 2))
    write_trace(path, quotes)
    return path


@pytest.mark.slow
def test_a_launched_job_appears_changes_state_live_and_shows_its_migration(
        tmp_path: Path, broker_home: Path, postgres_url: str, chromium: Any) -> None:
    env = {"BROKER_HOME": str(broker_home), "BROKER_DB_URL": postgres_url,
           "BROKER_MARKET": str(alternating_trace(tmp_path / "market.csv")), "BROKER_SPEED": "60",
           "BROKER_LOCAL_PROVISION_SECONDS": "60", "BROKER_POLL_SECONDS": "0.2", "BROKER_LEADER_CHECK_SECONDS": "1"}
    store = open_store(postgres_url)
    token = create_api_token(store, "research").token
    replica: Replica | None = None
    tab: Tab | None = None
    try:
        replica = start_replica("dash", env, tmp_path)
        wait_for(lambda: (replica.health() or {}).get("leader") if replica else None, 30, "leadership")
        tab = Tab(chromium, replica.url)
        tab.sign_in(token)
        tab.goto("/jobs")
        tab.page.evaluate("window.notReloaded = true")
        auth = {"Authorization": f"Bearer {token}"}
        response = httpx.post(f"{replica.url}/v1/jobs", json={"spec": JOB.format(workdir=ROOT / "examples")},
                              headers=auth, timeout=60)
        assert response.status_code == 201, response.text
        job_id = response.json()["job_id"]
        row = f"#job-rows tr[data-job='{job_id}']"
        tab.page.wait_for_selector(row, timeout=30_000)
        first = tab.page.inner_text(f"{row} .job-state")
        tab.page.wait_for_function(
            "([sel, was]) => { const c = document.querySelector(sel); return c && c.innerText !== was; }",
            arg=[f"{row} .job-state", first], timeout=90_000)
        assert tab.page.evaluate("window.notReloaded") is True  # htmx swapped the rows; the page stayed

        def settled() -> dict[str, Any] | None:
            url = f"{replica.url}/v1/jobs/{job_id}"  # type: ignore[union-attr]
            body: dict[str, Any] = httpx.get(url, headers=auth, timeout=10).json()
            moved = body["migrations"] >= 1 and body["state"] == "RUNNING"
            return body if moved or body["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

        final = wait_for(settled, 240, "the job to migrate and run again", every=1)
        assert final["migrations"] >= 1 and final["preemptions"] >= 1, final
        tab.goto(f"/jobs/{job_id}")
        tab.page.wait_for_selector("svg.timeline .marker.notice", state="attached", timeout=15_000)
        assert tab.page.locator("svg.timeline .marker.migration").count() >= 1
        zones = tab.page.locator("svg.timeline .cluster-band").evaluate_all("rs => rs.map(r => r.dataset.zone)")
        assert len(set(zones)) == 2  # ran in one zone, then the other
        tab.screenshot("job-migrated")
        assert tab.errors == []
    finally:
        if tab is not None:
            tab.close()
        if replica is not None:
            replica.stop()
        store.dispose()
