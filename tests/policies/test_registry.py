"""The policy registry: names checked where settings are read, simulator-only policies kept out of live brokers."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.backends.local.provisioner import LocalProvisioner, LocalWorld
from broker.backends.local.runtime import BUNDLED_MARKET
from broker.cli import main
from broker.config.settings import ConfigError, load_settings
from broker.engine import Engine, EngineOptions
from broker.store import open_store
from broker.tokens import SharedAgentTokens
from policies import kinds

JOB = """\
name: t
num_nodes: 1
resources:
  accelerators: V100:1
run: python train.py
"""


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("BROKER_SELECTION_POLICY", "typo"),
        ("BROKER_SELECTION_POLICY", "optimal"),
        ("BROKER_PLACEMENT_POLICY", "topology\tx"),
        ("BROKER_PREEMPTION_POLICY", "x" * 100_000),
        ("BROKER_SELECTION_POLICY", "../../etc/passwd"),
    ],
    ids=["typo", "simulator-only", "garbage", "huge", "path"],
)
def test_a_bad_policy_name_is_exit_2_before_anything_is_written(
        tmp_path: Path, broker_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        setting: str, value: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    monkeypatch.setenv(setting, value)
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", str(job)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    field = setting.removeprefix("BROKER_").lower()
    assert err.startswith("error:") and field in err and "Traceback" not in err
    assert len(err) < 2000  # one line naming the setting, not the whole huge value echoed back
    assert not (broker_home / "broker.db").exists()


def test_a_nul_in_a_policy_name_names_the_setting(broker_home: Path) -> None:
    with pytest.raises(ConfigError, match=r"selection_policy: .*unknown selection policy"):
        load_settings(selection_policy="broker\x00")


def test_every_kind_has_a_known_default_and_good_names_pass(broker_home: Path) -> None:
    for kind in kinds.KINDS:
        default = kinds.of(kind).default_name()
        assert default is not None and kinds.of(kind).check(default) == default
    settings = load_settings(selection_policy="greedy", placement_policy="first_fit")
    assert (settings.selection_policy, settings.placement_policy) == ("greedy", "first_fit")


def test_simulator_only_policies_are_refused_for_a_live_engine(broker_home: Path) -> None:
    assert kinds.selection.simulator_only("optimal")
    assert "optimal" in kinds.selection.names() and "optimal" not in kinds.selection.names(live=True)
    assert kinds.selection.get("optimal") is not None  # the simulator may still ask for it
    with pytest.raises(kinds.UnknownPolicy, match="runs only in `broker simulate`"):
        kinds.selection.get("optimal", live=True)
    store = open_store(f"sqlite:///{broker_home / 'engine.db'}")
    world = LocalWorld.begin(broker_home, str(BUNDLED_MARKET), 60.0)
    with pytest.raises(kinds.UnknownPolicy, match="optimal"):
        Engine(store, world.clock, world.market(), LocalProvisioner(broker_home, world),
               EngineOptions(home=broker_home, selection_policy="optimal"),
               tokens=SharedAgentTokens(store, broker_home))
    store.dispose()


def test_an_unknown_kind_and_a_second_policy_under_one_name_are_refused() -> None:
    with pytest.raises(kinds.UnknownPolicy, match="unknown policy kind 'scheduling'"):
        kinds.of("scheduling").check("x")
    with pytest.raises(ValueError, match="registered twice"):
        kinds.selection.register("broker")(lambda request: kinds.selection.get()(request))


def test_every_built_in_name_is_registered_under_its_kind() -> None:
    assert {kind: kinds.of(kind).names() for kind in kinds.KINDS} == {
        "selection": ["broker", "broker_lean", "cheapest_spot", "greedy", "on_demand", "optimal", "skypilot_eager",
                      "uniform_progress", "up_multi"],
        "placement": ["first_fit", "packed_sticky", "random", "topology"],
        "preemption": ["checkpoint_aware"],
        "admission": ["admit_all", "capacity_share"],
        "sharing": ["best_fit", "dot_product", "fgd", "first_fit", "gpu_clustering", "gpu_packing", "random"],
        "checkpointing": ["fixed_interval", "notice_only", "young_daly"],
        "eager": ["eager", "off"],
        "fair_share": ["fifo", "static_quota", "weighted_fair_share"],
    }


def test_choose_picks_one_policy_of_each_kind_from_the_settings_names() -> None:
    from policies.baselines import greedy
    from policies.broker_policy import broker
    from policies.checkpointing import notice_only
    from policies.placement import first_fit

    defaults = kinds.choose()
    assert (defaults.selection, defaults.eager_name) == (broker, "off")
    chosen = kinds.choose(selection_name="greedy", placement_name="first_fit", checkpointing_name="notice_only",
                          eager_name="eager")
    assert (chosen.selection, chosen.placement, chosen.checkpointing, chosen.eager_name) == (
        greedy, first_fit, notice_only, "eager")
    with pytest.raises(kinds.UnknownPolicy, match="unknown placement policy 'nope'"):
        kinds.choose(placement_name="nope")
