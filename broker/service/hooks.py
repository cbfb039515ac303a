"""The default price poller and report runner the scheduler calls, found by name in the settings.

The price pollers (``broker.pricing``, ``broker.market``) and the report builder
(``broker.reports``) are separate features; when a build lacks one, its hook does nothing and
says so once. ``price_poller``/``report_runner`` in the settings name other ``module:function``s.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from broker.config import ConfigError, Settings
from broker.store import Store

log = logging.getLogger("broker.service.hooks")
_said: set[str] = set()


def _absent(feature: str, exc: ImportError) -> None:
    if feature not in _said:
        _said.add(feature)
        log.info("%s: not part of this build (%s); the scheduled task does nothing", feature, exc.name)


def poll_prices(store: Store, settings: Settings, cloud: str) -> None:
    """Poll one cloud's spot and on-demand prices into the store's price book."""
    try:
        from broker.market import PriceBook  # type: ignore[attr-defined]
        from broker.pricing import poll_prices as poll  # type: ignore[import-not-found]
        from broker.pricing import price_sources
    except ImportError as exc:
        _absent("price polling", exc)
        return
    poll(PriceBook(store), price_sources(settings, [cloud]))


def run_due_reports(store: Store, settings: Settings, now: datetime) -> None:
    """Send the scheduled reports that are due, and budget alerts."""
    try:
        from broker.reports.schedule import check_budgets  # type: ignore[import-not-found]
        from broker.reports.schedule import run_due_reports as run
    except ImportError as exc:
        _absent("report schedules", exc)
        return
    run(store, settings, now)
    check_budgets(store, settings, now)


def resolve(name: str, setting: str) -> Callable[..., Any]:
    """``module:function`` to the function; a ConfigError naming the setting otherwise."""
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{setting}: expected module:function, got {name!r}")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{setting}: cannot find {name!r}: {exc}") from None
    if not callable(found):
        raise ConfigError(f"{setting}: {name!r} is not a function")
    return found  # type: ignore[no-any-return]
