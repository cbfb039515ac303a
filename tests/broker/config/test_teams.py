"""Teams in the settings, from the file and BROKER_TEAMS; hostile values refused in one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config.settings import ConfigError, load_settings
from broker.config.teams import fair_share_config
from policies.fair_share import Team
from tests.broker.config.test_settings import JOB, _fails


def test_teams_from_the_file_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("teams:\n  research: {weight: 3, limit_gpus: 16}\n"
                      "  nlp: {weight: 2, quota_gpus: {A100: 4, H100: 2}, parent: research}\n"
                      "fair_share_half_life_seconds: 7200\nmax_gpus: 8\n")
    settings = load_settings(config)
    fair = fair_share_config(settings)
    assert fair is not None
    assert fair.teams == (Team("nlp", 2.0, 6, None, "research", (("A100", 4), ("H100", 2))),
                          Team("research", 3.0, None, 16, None))
    assert (fair.half_life_s, fair.capacity_gpus, fair.policy) == (7200.0, 8, None)

    monkeypatch.setenv("BROKER_TEAMS", '{"a": {"weight": 1.5}, "b": {"parent": "a", "quota_gpus": 2}}')
    fair = fair_share_config(load_settings())
    assert fair is not None and fair.teams == (Team("a", 1.5), Team("b", 1.0, 2, None, "a"))


def test_no_teams_no_step() -> None:
    assert fair_share_config(load_settings()) is None
    assert fair_share_config(load_settings(budgets={"teams": {"a": 10.0}})) is None  # alerts only
    enforced = fair_share_config(load_settings(budgets={"teams": {"a": 10.0}, "enforce": True, "period": "week"}))
    assert enforced is not None and enforced.budgets == (("a", 10.0),) and enforced.budget_period == "week"


DEEP = '{"a":' + "[" * 20_000 + "]" * 20_000 + "}"
HUGE = '{"a": {"weight": 1}' + ', "b": {}' * 200_000 + "}"


@pytest.mark.parametrize(("value", "words"), [
    ('{"a": {"weight": -1}}', "teams.a.weight"),
    ('{"a": {"weight": 0}}', "teams.a.weight"),
    ('{"a": {"weight": "NaN"}}', "teams.a.weight"),
    ('{"a": {"weight": 1e400}}', "teams.a.weight"),
    ('{"a": {"weight": true}}', "teams.a.weight"),
    ('{"a": {"weight": [1]}}', "teams.a.weight"),
    ('{"a": {"parent": "b"}, "b": {"parent": "a"}}', "a.parent: a cycle in the hierarchy: a -> b -> a"),
    ('{"a": {"parent": "a"}}', "a.parent: a cycle"),
    ('{"a": {"parent": "nobody"}}', "a.parent: unknown team 'nobody'"),
    ('{"a\\u0000b": {}}', "expected printable characters"),
    ('{"\\ud800": {}}', "expected printable characters"),
    ('{" a": {}}', "without surrounding spaces"),
    ('{"": {}}', "non-empty"),
    ('{"' + "x" * 500 + '": {}}', "at most 100 characters"),
    ('{"a": {"quota_gpus": -1}}', "teams.a.quota_gpus"),
    ('{"a": {"quota_gpus": {"A100": -1}}}', "teams.a.quota_gpus"),
    ('{"a": {"quota_gpus": {"A1\\u000000": 1}}}', "expected a GPU type"),
    ('{"a": {"quota_gpus": {"A100": NaN}}}', "teams.a.quota_gpus: Value error, A100: expected a whole number of GPUs"),
    ('{"a": {"quota_gpus": {"A100": 1.5}}}', "teams.a.quota_gpus: Value error, A100: expected a whole number of GPUs"),
    ('{"a": {"quota_gpus": {"A100": {"count": 2}}}}',
     "teams.a.quota_gpus: Value error, A100: expected a whole number of GPUs"),
    ('{"a": {"quota_gpus": {"A100": "lots"}}}',
     "teams.a.quota_gpus: Value error, A100: expected a whole number of GPUs"),
    ('{"a": {"quota_gpus": {"": 2}}}', "expected a GPU type"),
    ('{"a": {"quota_gpus": [4]}}', "teams.a.quota_gpus"),
    ('{"a": {"quota_gpus": 5, "limit_gpus": 2}}', "a.quota_gpus: 5 GPUs guaranteed is more than its limit_gpus 2"),
    ('{"a": {"limit_gpus": 1e400}}', "teams.a.limit_gpus"),
    ('{"a": {"limit_gpus": 10000000000}}', "teams.a.limit_gpus"),
    ('{"a": {"colour": "blue"}}', "teams.a.colour"),
    ("[1, 2]", "teams"),
    ('{"a": 3}', "teams.a"),
    ("{bad", "teams: Value error, expected a JSON object"),
    (DEEP, "nested 20001 deep"),
    (HUGE, "at most 1000000 characters"),
], ids=["negative-weight", "zero-weight", "nan-weight", "inf-weight", "bool-weight", "list-weight", "cycle",
        "own-parent", "unknown-parent", "nul-name", "surrogate-name", "spaced-name", "empty-name", "long-name",
        "negative-quota", "negative-typed-quota", "nul-gpu-type", "nan-typed-quota", "fractional-typed-quota",
        "nested-typed-quota", "text-typed-quota", "empty-gpu-type", "list-quota", "quota-over-limit", "inf-limit",
        "huge-limit",
        "unknown-field", "list", "not-a-mapping", "bad-json", "deep", "huge"])
def test_hostile_teams_are_refused_at_load_naming_the_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str,
        words: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BROKER_TEAMS", value)
    (tmp_path / "job.yaml").write_text(JOB)
    line = _fails(["launch", "job.yaml"], capsys)
    assert "teams" in line and words in line
    assert len(line) < 600
    assert not (tmp_path / "home" / "broker.db").exists()


@pytest.mark.parametrize(("content", "words"), [
    ("fair_share_policy: nope\n", "unknown fair_share policy 'nope'"),
    ("fair_share_half_life_seconds: -5\n", "fair_share_half_life_seconds"),
    ("fair_share_half_life_seconds: .inf\n", "fair_share_half_life_seconds"),
    ("budgets: {teams: {a: 5}, enforce: maybe}\n", "budgets.enforce"),
    ("budgets: {teams: {a: 5}, enforce: true, over_budget: explode}\n", "budgets.over_budget"),
    ("teams: {a: {parent: b}, b: {parent: c}, c: {parent: a}}\n", "a -> b -> c -> a"),
])
def test_hostile_fair_share_settings_in_the_file(tmp_path: Path, content: str, words: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_settings(config)
    assert words in str(error.value) and "\n" not in str(error.value)
