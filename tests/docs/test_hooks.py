"""The reference pages are generated from the code: whatever the code declares appears, with no edit."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

from tests.docs.docs_pages import ROOT


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_appears_with_its_environment_variable(hooks: ModuleType) -> None:
    from broker.config.settings import Settings

    table = hooks.settings_reference()
    for name in Settings.model_fields:
        assert f"| `{name}` |" in table, name
    assert "| `start_retries` | `BROKER_START_RETRIES` | int | `2` |" in table
    # the AWS endpoints keep boto3's own environment names
    assert "| `aws_endpoint_url_ec2` | `AWS_ENDPOINT_URL_EC2` |" in table


def test_every_key_of_the_broker_section_appears_nested_keys_dotted(hooks: ModuleType) -> None:
    from broker.spec.broker_section import BrokerModel, CheckpointModel, TopologyModel

    table = hooks.job_file_reference()
    keys = [*(k for k in BrokerModel.model_fields if k not in ("checkpoint", "topology")),
            *(f"checkpoint.{k}" for k in CheckpointModel.model_fields),
            *(f"topology.{k}" for k in TopologyModel.model_fields)]
    for key in keys:
        assert f"| `{key}` |" in table, key
    assert "| `topology.level` | 'node' or 'placement_group' or 'any' | `any` |" in table


def test_every_command_and_option_appears(hooks: ModuleType) -> None:
    text = hooks.cli_reference()
    for command in ["launch", "status", "cancel", "logs", "engine", "prices", "simulate", "simulate-placement",
                    "show-topology", "report", "serve", "dashboard", "token create", "token list", "token revoke"]:
        assert f"## `broker {command}`" in text, command
    assert "| `--market-clock` | `BROKER_MARKET_CLOCK` | `own` |" in text
    assert "| `JOB_FILE` |" in text


def test_every_route_and_body_appears(hooks: ModuleType) -> None:
    text = hooks.api_reference()
    for route in ["| POST | `/v1/jobs` |", "| GET | `/v1/jobs/{job_id}/logs` |", "| POST | `/v1/pipelines` |",
                  "| POST | `/v1/notices` |", "| GET | `/v1/health` |"]:
        assert route in text, route
    assert "### `CancelResult`" in text and "| `job_id` | string | yes |" in text


def test_every_metric_appears(hooks: ModuleType) -> None:
    text = hooks.metrics_reference()
    for metric in ["broker_jobs", "broker_gpus", "broker_preemptions_total", "broker_leader",
                   "broker_http_request_seconds"]:
        assert f"| `{metric}` |" in text, metric


def test_a_marker_is_replaced_and_an_unknown_one_is_refused(hooks: ModuleType) -> None:
    page = "# Settings\n\n<!-- generated: settings -->\n"
    expanded = hooks.expand(page)
    assert "<!-- generated" not in expanded and "`BROKER_HOME`" in expanded
    with pytest.raises(ValueError, match="unknown generated reference 'nope'"):
        hooks.expand("<!-- generated: nope -->")


def test_the_readme_is_the_home_page_with_links_into_the_site(hooks: ModuleType) -> None:
    home = hooks.readme_as_home((ROOT / "README.md").read_text())
    assert "](docs/" not in home and "](reference/settings.md)" in home
