"""The Prometheus rules and the Grafana dashboard, checked by promtool and against a real /metrics scrape."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.api.jobs import JobIntake
from broker.clock import WallClock
from broker.store import open_store
from tests.broker.web.seed import seed_fleet

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "spot-broker.json"
METRIC = re.compile(r"\bbroker_[a-zA-Z0-9_]+")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/test.sh installs Debian's prometheus package")
        pytest.skip("promtool is missing (apt-get install prometheus)")
    return found


@pytest.mark.parametrize("args", [["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"],
                                  ["check", "config", "prometheus.yml"]])
def test_promtool_accepts_the_rules_their_tests_and_the_config(args: list[str]) -> None:
    done = subprocess.run([_promtool(), *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every metric name the service's /metrics exports, with a fleet in the store."""
    home = tmp_path_factory.mktemp("home")
    store = open_store(f"sqlite:///{home / 'broker.db'}")
    seed_fleet(store)
    client = TestClient(create_app(store, WallClock(), JobIntake(home, "local", None), is_leader=lambda: True))
    client.get("/v1/health")
    body = client.get("/metrics").text
    store.dispose()
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in body.splitlines() if line and not line.startswith("#")}


def test_every_dashboard_panel_queries_metrics_the_service_exports(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    assert [v["type"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for panel in dashboard["panels"]:
        assert panel["type"] in ("timeseries", "stat") and panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = METRIC.findall(target["expr"])
            assert names, f"{panel['title']}: {target['expr']} names no broker metric"
            missing = set(names) - exported
            assert not missing, f"{panel['title']}: {sorted(missing)} not in /metrics"


def test_every_alert_watches_metrics_the_service_exports(exported: set[str]) -> None:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {"BrokerBudgetBurn", "BrokerJobStuckInState",
                                          "BrokerNoticeToReplacementSlow", "BrokerCloudPricesStale", "BrokerNoLeader"}
    for rule in rules:
        names = set(METRIC.findall(rule["expr"]))
        assert names and names <= exported, (rule["alert"], names - exported)


def test_the_new_ages_are_read_from_the_store(exported: set[str]) -> None:
    assert {"broker_job_state_age_seconds", "broker_price_age_seconds", "broker_notice_to_replacement_seconds",
            "broker_leader", "broker_http_request_seconds_bucket"} <= exported
