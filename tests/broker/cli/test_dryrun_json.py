"""``launch --backend skypilot --dryrun [--json]``: the plan from the price book, SkyPilot's dry run offline.

Real SkyPilot in a child process, pointed at an API server that is not there (what an offline
laptop or a CI runner meets): its dry run cannot run, the broker's plan still prints, exit 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.market.book import PriceBook
from broker.store import open_store
from providers.base import SpotQuote
from tests.broker.service.replicas import free_port

JOB = "name: train\nnum_nodes: 2\nresources:\n  accelerators: H100:1\nrun: python train.py\n"


def seed(home: Path) -> None:
    """What a poll of GCP and AWS brought back: GCP's a3-highgpu-1g (one H100) that the built-in catalog
    lacks, and an AWS zone whose placement score says a launch is unlikely."""
    store = open_store(f"sqlite:///{home / 'broker.db'}")
    now = datetime.now(UTC)
    try:
        book = PriceBook(store)
        book.record("gcp", [SpotQuote("gcp", "us-east4", "us-east4-b", "a3-highgpu-1g", "H100", 1, 1.95, 11.06,
                                      now - timedelta(hours=3))], at=now - timedelta(hours=3))
        book.record("gcp", [
            SpotQuote("gcp", "us-central1", "us-central1-a", "a3-highgpu-1g", "H100", 1, 2.25, 11.06, now),
            SpotQuote("gcp", "us-east4", "us-east4-b", "a3-highgpu-1g", "H100", 1, 2.10, 11.06, now),
        ], at=now)
        book.record("aws", [
            SpotQuote("aws", "us-east-1", "us-east-1a", "p5.4xlarge", "H100", 1, 1.50, 6.88, now, capacity_score=1.0),
        ], at=now)
    finally:
        store.dispose()


def run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "broker-home"
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "SKYPILOT_", "AWS_"))}
    # cheapest_spot: the plain rule (the default policy may wait for the cheaper zone's capacity).
    env.update(HOME=str(tmp_path / "user"), BROKER_HOME=str(home), BROKER_SELECTION_POLICY="cheapest_spot",
               SKYPILOT_API_SERVER_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    return subprocess.run([sys.executable, "-m", "broker", "launch", str(job), "--backend", "skypilot", "--dryrun",
                           *flags], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    home = tmp_path / "broker-home"
    home.mkdir()
    seed(home)
    return tmp_path


@pytest.mark.slow
def test_json_is_one_object_of_ranked_offers_from_the_price_book(seeded: Path) -> None:
    done = run(seeded, "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)  # the whole of stdout: nothing of SkyPilot's
    first = plan["offers"][0]
    assert {k: first[k] for k in ("cloud", "region", "zone", "instance_type", "spot", "source")} == {
        "cloud": "gcp", "region": "us-east4", "zone": "us-east4-b", "instance_type": "a3-highgpu-1g",
        "spot": True, "source": "price-book"}
    assert first["price_per_hour"] == pytest.approx(4.20)  # the gang: 2 nodes at 2.10
    assert 0 <= first["quote_age_s"] < 600
    assert all(o["zone"] != "us-east-1a" for o in plan["offers"] if o["spot"])  # placement score 1: unlikely
    assert [o["zone"] for o in plan["market"]] == ["us-east-1a", "us-east4-b", "us-central1-a"]
    assert plan["market"][0]["capacity_score"] == 1.0 and plan["market"][0]["available_nodes"] == 0
    assert first["spot_last_24h"] == {"spot_min": 1.95, "spot_max": 2.10, "changes": 1}
    assert plan["skypilot_dry_run"].startswith("offline: ApiServerConnectionError")
    for said in (done.stdout, done.stderr):
        assert "<sky-payload>" not in said and "Traceback" not in said


@pytest.mark.slow
def test_the_table_says_in_one_line_that_skypilot_could_not_dry_run(seeded: Path) -> None:
    done = run(seeded)
    assert done.returncode == 0, done.stderr
    assert "gcp/us-east4-b" in done.stdout and "price-book" in done.stdout
    lines = [line for line in done.stdout.splitlines() if "SkyPilot's dry run could not" in line]
    assert len(lines) == 1 and "the plan above is the broker's own" in lines[0]
    for said in (done.stdout, done.stderr):
        assert "<sky-payload>" not in said and "Traceback" not in said


def test_a_catalog_download_that_cannot_connect_is_offline_not_a_refusal() -> None:
    """What SkyPilot 0.14 raises when its dry run cannot download its catalog (seen on a machine
    without network): a CloudError wrapping the requests error, with no exception chained."""
    from sky import exceptions

    from broker.cli.sky_dryrun import _offline

    download = exceptions.CloudError(
        "requests error (ConnectionError): HTTPSConnectionPool(host='raw.githubusercontent.com', port=443): "
        "Max retries exceeded with url: /skypilot-org/skypilot-catalog/master/catalogs/v8/aws/vms.csv",
        "aws", "requests error")
    assert _offline(download, "")
    assert not _offline(exceptions.CloudError("quota exceeded for P instances", "aws", "QuotaError"), "")
    assert not _offline(exceptions.ResourcesUnavailableError("no resources"), "")


def test_the_plan_table_shows_the_first_offers_and_says_how_many_more() -> None:
    from rich.console import Console

    from broker.cli.sky_dryrun import TABLE_ROWS, _plan_table

    rows = [{"rank": i + 1, "kind": "spot", "cloud": "aws", "zone": f"us-east-1{'abcdef'[i % 6]}",
             "instance_type": "m6i.2xlarge", "price_per_node_hour": 0.1 + i / 1000, "price_per_hour": 0.1 + i / 1000,
             "quote_age_s": 60.0, "stale": False, "source": "price-book"} for i in range(TABLE_ROWS + 7)]
    console = Console(width=200, record=True)
    console.print(_plan_table(rows, "good spot"))
    text = console.export_text()
    assert f"│ {TABLE_ROWS} " in text and f"│ {TABLE_ROWS + 1} " not in text
    assert "... and 7 more offers, in order (all of them with --json)" in text
    console = Console(width=200, record=True)
    console.print(_plan_table(rows[:3], "good spot"))
    assert "more offers" not in console.export_text()
