"""/metrics across replicas: the fleet's figures from the leader alone, so a sum over replicas counts it once."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from broker.api.app import create_app
from broker.api.metrics import engine_heartbeat
from broker.clock import WallClock
from broker.intake import Intake
from broker.reports.settings import BudgetSettings
from broker.store import open_store
from tests.broker.web.seed import seed_fleet

TIMED = ("_age_seconds", "_notice_to_replacement_seconds")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
REPLICA_OWN = ("broker_http_request_seconds", "broker_leader", "broker_engine_last_step_timestamp_seconds")


def _samples(body: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _fleet(samples: Samples) -> Samples:
    return {key: value for key, value in samples.items() if not key[0].startswith(REPLICA_OWN)}


@pytest.fixture
def scrape(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    seed_fleet(store)
    budgets = BudgetSettings(teams={"alpha": 50.0, "beta": 5000.0})

    def get(is_leader: bool | None) -> str:
        app = create_app(store, WallClock(), Intake(tmp_path, "local", None),
                         is_leader=None if is_leader is None else (lambda: is_leader), budgets=budgets)
        return TestClient(app).get("/metrics").text

    yield get
    store.dispose()


def test_two_replicas_summed_equal_one_fleet(scrape) -> None:  # type: ignore[no-untyped-def]
    alone = _fleet(_samples(scrape(None)))  # one broker with no election exports everything
    leader, follower = _samples(scrape(True)), _samples(scrape(False))
    summed: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
    for samples in (leader, follower):
        for key, value in _fleet(samples).items():
            summed[key] += value
    # Ages are read from the wall clock at each scrape: the same series, a moment apart.
    assert alone and summed.keys() == alone.keys()
    assert {k: v for k, v in summed.items() if not k[0].endswith(TIMED)} == \
        pytest.approx({k: v for k, v in alone.items() if not k[0].endswith(TIMED)})
    assert not _fleet(follower)  # the follower exports only its own figures
    assert follower[("broker_leader", ())] == 0 and leader[("broker_leader", ())] == 1


def test_spend_is_labelled_by_team_and_cloud_and_budgets_by_team(scrape) -> None:  # type: ignore[no-untyped-def]
    samples = _samples(scrape(True))
    spend = {labels: value for (name, labels), value in samples.items() if name == "broker_spend_dollars_total"}
    teams = {dict(labels).get("team") for labels in spend}
    clouds = {dict(labels)["cloud"] for labels in spend}
    assert {"alpha", "beta"} <= teams and clouds == {"aws", "gcp", "azure"}
    assert all(value >= 0 for value in spend.values()) and sum(spend.values()) > 0
    budget = {dict(labels)["team"]: value for (name, labels), value in samples.items()
              if name == "broker_team_budget_dollars"}
    assert budget == {"alpha": 50.0, "beta": 5000.0}
    period = {dict(labels)["team"] for (name, labels) in samples if name == "broker_team_period_spend_dollars"}
    assert period == {"alpha", "beta"}
    assert samples[("broker_team_budget_period_seconds", (("team", "alpha"),))] == 30 * 86400


def test_the_engine_heartbeat_is_the_replicas_own(scrape) -> None:  # type: ignore[no-untyped-def]
    engine_heartbeat.beat()
    stepped = engine_heartbeat.last()
    samples = _samples(scrape(False))
    assert samples[("broker_engine_last_step_timestamp_seconds", ())] == stepped > 0
