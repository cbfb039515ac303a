"""The Prometheus rules and the Grafana dashboard, checked by promtool, Grafana's schema and a real /metrics scrape."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.clock import WallClock
from broker.intake import Intake
from broker.reports.settings import BudgetSettings
from broker.store import open_store
from tests.broker.web.seed import seed_fleet
from tests.monitoring.grafana_schema import dashboard_errors

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
    client = TestClient(create_app(store, WallClock(), Intake(home, "local", None), is_leader=lambda: True,
                                   budgets=BudgetSettings(teams={"alpha": 500.0})))
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
            # DCGM's names are exported once a running job has measured GPUs: tests/broker/api/test_gpu_metrics.py.
            assert names or "DCGM_FI_DEV_" in target["expr"], f"{panel['title']}: {target['expr']} names no metric"
            missing = set(names) - exported
            assert not missing, f"{panel['title']}: {sorted(missing)} not in /metrics"


def test_the_dashboard_fits_grafanas_dashboard_schema() -> None:
    assert dashboard_errors(json.loads(DASHBOARD.read_text())) == []


def _rename(panel: dict[str, Any], old: str, new: str) -> None:
    panel[new] = panel.pop(old)


BREAKAGES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "misspelt panel field": (lambda p: _rename(p, "gridPos", "gridPosition"), "panels[0].gridPosition: not a field"),
    "misspelt option": (lambda p: _rename(p["options"]["legend"], "showLegend", "showLegnd"),
                        "panels[0].options.legend.showLegnd: not a field"),
    "misspelt query field": (lambda p: _rename(p["targets"][0], "legendFormat", "legend"),
                             "panels[0].targets[0].legend: not a field"),
    "width as a string": (lambda p: p["gridPos"].update(w="12"), "panels[0].grid_pos.w: '12' is not of type int"),
    "legend placed nowhere": (lambda p: p["options"]["legend"].update(placement="middle"),
                              "panels[0].options.legend.placement: 'middle' is not one of ['bottom', 'right']"),
    "panel type with no schema": (lambda p: p.update(type="graph"), "panels[0].type: 'graph' is a panel type"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_copy_of_the_dashboard_fails_the_schema(breakage: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    broken = copy.deepcopy(dashboard)
    breaks, expected = BREAKAGES[breakage]
    breaks(broken["panels"][0])
    assert broken != dashboard
    assert [f"dashboard.{expected}" in line for line in dashboard_errors(broken)] == [True]


def _promtool_parses(expressions: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on one recording rule per expression: it parses each as PromQL."""
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": name, "expr": expr}
                                                         for name, expr in expressions.items()]}]}
    (tmp_path / "dashboard_rules.yml").write_text(yaml.safe_dump(rules))
    return subprocess.run([_promtool(), "check", "rules", "dashboard_rules.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_every_dashboard_expression_is_promql_that_parses(tmp_path: Path) -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    expressions = {f"panel_{p['id']}_{t['refId']}": t["expr"] for p in panels for t in p["targets"]}
    done = _promtool_parses(expressions, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in done.stdout


def test_promtool_refuses_an_expression_that_does_not_parse(tmp_path: Path) -> None:
    done = _promtool_parses({"panel_1_A": "rate(broker_spend_dollars_total[1h] * 3600"}, tmp_path)
    assert done.returncode != 0
    assert "panel_1_A" in done.stdout + done.stderr


def test_every_alert_watches_metrics_the_service_exports(exported: set[str]) -> None:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {
        "BrokerJobStuckInState", "BrokerJobGpusIdle", "BrokerNoticeToReplacementSlow", "BrokerCloudPricesStale",
        "BrokerNoLeader", "BrokerTeamBudgetBurn", "BrokerTeamBudgetNearlySpent", "BrokerTeamBudgetSpent",
        "BrokerReplicaDown", "BrokerEngineNotStepping", "BrokerApiErrors", "BrokerReportDeliveryFailed",
        "BrokerJobFailureRateHigh"}
    for rule in rules:
        names = set(METRIC.findall(rule["expr"]))
        if rule["alert"] == "BrokerReplicaDown":  # Prometheus's own series for a target it cannot scrape
            assert 'up{job="spot-broker"}' in rule["expr"]
            continue
        # DCGM's names are exported once a running job has measured GPUs: tests/broker/api/test_gpu_metrics.py.
        assert names or re.search(r"\bDCGM_FI_DEV_", rule["expr"]), rule["alert"]
        assert names <= exported, (rule["alert"], names - exported)


def test_the_new_ages_are_read_from_the_store(exported: set[str]) -> None:
    assert {"broker_job_state_age_seconds", "broker_price_age_seconds", "broker_notice_to_replacement_seconds",
            "broker_leader", "broker_http_request_seconds_bucket"} <= exported


def test_every_alert_has_a_promtool_case_where_it_fires() -> None:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]
    cases = [case for test in yaml.safe_load((MONITORING / "alerts_test.yml").read_text())["tests"]
             for case in test["alert_rule_test"]]
    scrape = yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"]
    assert [c["job_name"] for c in scrape] == ["spot-broker"]  # the job BrokerReplicaDown watches
    for rule in rules:
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it fires"
