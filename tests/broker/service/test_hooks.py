"""The scheduler's hooks: unset, the built-in ones; set, any ``module:function`` (the built-ins too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config.file import ConfigError
from broker.config.settings import load_settings
from broker.service import hooks


def test_unset_hooks_are_the_built_in_ones_and_named_ones_still_resolve(broker_home: Path) -> None:
    settings = load_settings()
    assert (settings.price_poller, settings.report_runner) == (None, None)
    assert hooks.resolve(settings.price_poller, "price_poller") is hooks.poll_prices
    assert hooks.resolve(settings.report_runner, "report_runner") is hooks.run_due_reports
    named = load_settings(price_poller="broker.service.hooks:poll_prices")
    assert hooks.resolve(named.price_poller, "price_poller") is hooks.poll_prices


@pytest.mark.parametrize("name", ["nomodule", "broker.service.hooks:missing", "no.such.module:f", "x" * 10_000])
def test_a_bad_hook_is_one_line_naming_the_setting(name: str) -> None:
    with pytest.raises(ConfigError, match=r"^price_poller: ") as raised:
        hooks.resolve(name, "price_poller")
    assert len(str(raised.value)) < 600
