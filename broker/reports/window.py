"""The window a report covers, from ``--since``/``--from``/``--to`` (the CLI) or the same fields of a form.

One reading for `broker report`, the API and the dashboard's Overview, so the same words cover the
same minutes everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING

from broker.errors import UserError

if TYPE_CHECKING:
    from broker.store import Store

MAX_FIELD = 40  # longer than any date, time or duration the window takes


class ReportError(UserError, ValueError):
    """Bad report input (window, team); the message names the option and what was expected."""


@dataclass(frozen=True, slots=True)
class Window:
    start: datetime
    end: datetime


def parse_window(since: str | None, start: str | None, end: str | None, now: datetime) -> Window:
    """``--since 7d`` back from ``--to`` (default now), or ``--from``/``--to`` as ISO dates or times (UTC)."""
    from broker.spec.values import duration  # not broker.spec.job: a bad --since is refused without its imports

    _check_fields(since, start, end)
    if since and start:
        raise ReportError("give either --since or --from, not both")
    stop = _parse_time(end, "--to") if end else now
    if start:
        begin = _parse_time(start, "--from")
    else:
        try:
            begin = stop - duration(since or "7d")
        except ValueError as exc:
            raise ReportError(f"--since: {exc}") from exc
    if begin >= stop:
        raise ReportError(f"--from {begin:%Y-%m-%d %H:%M} must be before --to {stop:%Y-%m-%d %H:%M}")
    return Window(begin, stop)


def _check_fields(since: str | None, start: str | None, end: str | None) -> None:
    for name, value in (("since", since), ("from", start), ("to", end)):
        if value is not None and (len(value) > MAX_FIELD or "\x00" in value):
            raise ReportError(f"--{name}: expected a short date, time or duration")


def _parse_time(text: str, option: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        try:
            value = datetime.combine(date.fromisoformat(text), time())
        except ValueError:
            raise ReportError(f"{option}: expected a date like 2026-01-05 or a time like 2026-01-05T08:00, "
                              f"got {text!r}") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def ledger_now(store: Store) -> datetime:
    """Now, or later if the ledger already holds later minutes (a local replay runs its clock ahead)."""
    from sqlalchemy import func, select

    from broker.store.tables import LedgerRow

    with store.transaction() as s:
        newest = s.scalar(select(func.max(LedgerRow.minute)))
    now = datetime.now(UTC)
    if newest is None:
        return now
    newest = newest if newest.tzinfo else newest.replace(tzinfo=UTC)
    return max(now, newest + timedelta(minutes=1))


def report_window(store: Store, since: str | None, start: str | None, end: str | None) -> Window:
    """The window `broker report --since/--from/--to` covers, ending by default at ``ledger_now``.

    Empty fields (a form's) count as not given; ReportError names the bad field.
    """
    since, start, end = since or None, start or None, end or None
    _check_fields(since, start, end)  # garbage is refused before the store is read
    return parse_window(since, start, end, ledger_now(store))
