"""The default price poller and report runner the scheduler calls, found by name in the settings.

``price_poller``/``report_runner`` in the settings may name other ``module:function``s instead; left
unset, they are these.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

from broker.config.settings import ConfigError, Settings
from broker.market.book import PriceBook
from broker.market.polling import poll_prices as poll
from broker.reports.schedule import check_budgets
from broker.reports.schedule import run_due_reports as run
from broker.store import Store
from providers.sources import price_sources


def poll_prices(store: Store, settings: Settings, cloud: str) -> None:
    """Poll one cloud's spot and on-demand prices into the store's price book."""
    poll(PriceBook(store), price_sources(settings, [cloud]))


def run_due_reports(store: Store, settings: Settings, now: datetime) -> None:
    """Send the scheduled reports that are due, and budget alerts."""
    run(store, settings, now)
    check_budgets(store, settings, now)


BUILT_IN: dict[str, Callable[..., Any]] = {"price_poller": poll_prices, "report_runner": run_due_reports}


def find(name: str, setting: str) -> Any:
    """``module:attribute`` to the object; a ConfigError naming the setting otherwise."""
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{setting}: expected module:attribute, got {name[:200]!r}")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{setting}: cannot find {name[:200]!r}: {str(exc)[:200]}") from None


def resolve(name: str | None, setting: str) -> Callable[..., Any]:
    """``module:function`` to the function (None: this module's hook for ``setting``); a ConfigError
    naming the setting otherwise."""
    if name is None and setting in BUILT_IN:
        return BUILT_IN[setting]
    if name is None:
        raise ConfigError(f"{setting}: expected module:function")
    found = find(name, setting)
    if not callable(found):
        raise ConfigError(f"{setting}: {name!r} is not a function")
    return found  # type: ignore[no-any-return]
