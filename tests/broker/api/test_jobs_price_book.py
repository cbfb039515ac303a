"""``POST /v1/jobs`` on the SkyPilot backend judges a job by the service's price book first: an
instance type or accelerator the clouds quote is accepted though the built-in catalog lacks it; an
unknown one is still a 422 naming the field, and hostile bodies stay 4xx with nothing stored."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from broker.api.app import create_app
from broker.clock import WallClock
from broker.intake import Intake
from broker.market.book import PriceBook
from broker.store import Store, open_store
from broker.store.tables import JobRow
from broker.tokens import create_api_token
from providers.base import SpotQuote

NOW = datetime.now(UTC)
# Offers the price book quotes: Azure's ND H200 v5, and a size the built-in catalog lacks (no catalog names
# an MI355X: a size Azure may sell later).
H200 = SpotQuote("azure", "eastus", "eastus-1", "Standard_ND96isr_H200_v5", "H200", 8, 38.0, 110.0, NOW, 141.0)
MI355X = SpotQuote("azure", "eastus", "eastus-2", "Standard_ND96isr_MI355X_v6", "MI355X", 8, 24.0, 64.0, NOW, 288.0)
CPU = SpotQuote("aws", "us-east-1", "us-east-1a", "m6i.2xlarge", "", 0, 0.12, 0.384, NOW)


@dataclass
class Service:
    client: TestClient
    store: Store
    headers: dict[str, str]

    def post(self, text: str) -> tuple[int, dict[str, object]]:
        response = self.client.post("/v1/jobs", json={"spec": text}, headers=self.headers)
        return response.status_code, response.json()

    def stored(self, job_id: str) -> str:
        """The stored job's accelerator and GPUs per node, as NAME:COUNT."""
        with self.store.transaction() as s:
            job = s.get(JobRow, job_id)
            assert job is not None
            return f"{job.accelerator}:{job.gpus_per_node}"

    def jobs(self) -> int:
        with self.store.transaction() as s:
            return int(s.scalar(select(func.count()).select_from(JobRow)) or 0)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    PriceBook(store).record("azure", [H200, MI355X], at=NOW)
    PriceBook(store).record("aws", [CPU], at=NOW)
    app = create_app(store, WallClock(), Intake(tmp_path, "skypilot", None, offline=True))
    token = create_api_token(store, "alpha").token
    yield Service(TestClient(app), store, {"Authorization": f"Bearer {token}"})
    store.dispose()


def task(resources: str) -> str:
    return f"name: big\nresources:\n{resources}run: python train.py\n"


@pytest.mark.parametrize(("resources", "gpus"), [
    ("  accelerators: MI355X:8\n", "MI355X:8"),
    ("  cloud: azure\n  accelerators: H200:8\n", "H200:8"),
    ("  cloud: azure\n  instance_type: Standard_ND96isr_H200_v5\n", "H200:8"),  # GPUs as the book quotes them
], ids=["accelerator", "accelerator-on-a-cloud", "instance-type-alone"])
def test_what_the_price_book_quotes_is_accepted(service: Service, resources: str, gpus: str) -> None:
    status, body = service.post(task(resources))
    assert status == 201, body
    assert service.stored(str(body["job_id"])) == gpus


def test_the_same_jobs_are_refused_by_the_catalog_without_the_price_book(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    client = TestClient(create_app(store, WallClock(), Intake(tmp_path, "skypilot", None, offline=True)))
    headers = {"Authorization": f"Bearer {create_api_token(store, 'alpha').token}"}
    response = client.post("/v1/jobs", json={"spec": task("  accelerators: MI355X:8\n")}, headers=headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "spec", "resources", "accelerators"]
    store.dispose()


@pytest.mark.parametrize(("resources", "loc", "words"), [
    ("  accelerators: H900:8\n", ["resources", "accelerators"], "unknown accelerator 'H900'"),
    ("  cloud: azure\n  accelerators: MI355X:16\n", ["resources", "accelerators"], "MI355X"),
    ("  cloud: aws\n  accelerators: H200:8\n  instance_type: not_a_type\n", ["resources", "instance_type"],
     "unknown instance type"),
    ("  accelerators: \"MI355X\\0:8\"\n", ["resources", "accelerators"], ""),
    (f"  accelerators: {'H' * 100_000}:8\n", ["resources", "accelerators"], ""),
    ("  accelerators: MI355X:99999999999999999999\n", ["resources", "accelerators"], ""),
    ("  instance_type: " + "[" * 40 + "]" * 40 + "\n", ["resources", "instance_type"], ""),
], ids=["unknown-name", "more-gpus-than-quoted", "unknown-type", "nul", "huge-name", "huge-count", "deep"])
def test_what_nobody_quotes_is_still_a_422_naming_the_field(service: Service, resources: str, loc: list[str],
                                                             words: str) -> None:
    status, body = service.post(task(resources))
    assert status == 422, body
    [problem] = body["detail"]  # type: ignore[misc]
    assert problem["loc"][2:4] == loc
    assert words in str(body["message"])
    assert "Traceback" not in str(body)
    assert service.jobs() == 0


def test_a_cpu_task_is_judged_by_its_shape_as_before(service: Service) -> None:
    status, body = service.post(task("  cpus: 8+\n  memory: 32+\n"))
    assert status == 201, body
    assert service.stored(str(body["job_id"])) == "None:0"
