"""Parsers for the scalar values a job file holds; each raises ``ValueError`` saying what was expected."""

from __future__ import annotations

import re
import signal
from datetime import UTC, datetime, timedelta
from typing import Any

from broker.model import TEAM_PATTERN
from providers.base import CLOUDS

PRIORITY_CLASSES: dict[str, int] = {"inference": 1000, "training": 500, "batch": 100}
CHECKPOINT_URL_SCHEMES: tuple[str, ...] = ("s3", "gs", "az")
# SIGKILL and SIGSTOP cannot be caught, so a job could never checkpoint on them.
_UNCATCHABLE = frozenset({"SIGKILL", "SIGSTOP"})

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d|w)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "w": 604800}
DURATION_EXPECTED = "a duration like 90s, 30m, 1.5h or 2d"
MAX_DURATION_S = 100 * 365 * 86400.0  # a century: anything longer is a typo, and overflows datetimes
MAX_PRIORITY = 1_000_000
MAX_NAME_CHARS = 200  # the store's job-name column
MAX_TEAM_CHARS = 100  # the store's team column
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux: a longer checkpoint dir can never be created


def duration(value: Any) -> timedelta:
    """``90s``, ``30m``, ``1.5h``, ``2d``, ``1w`` or a bare number of seconds; positive."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected {DURATION_EXPECTED}, got {value!r}")
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"expected {DURATION_EXPECTED}, got {value!r}")
        seconds = float(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "s").lower()]
    else:
        seconds = float(value)
    if seconds > MAX_DURATION_S:
        raise ValueError(f"expected {DURATION_EXPECTED} of at most 100 years, got {value!r}")
    if seconds <= 0:
        raise ValueError(f"expected a positive duration ({DURATION_EXPECTED}), got {value!r}")
    return timedelta(seconds=seconds)


def deadline(value: Any, now: datetime | None) -> datetime | timedelta:
    """A duration after submission, or an ISO 8601 timestamp (UTC unless it gives an offset).

    With ``now`` given, a timestamp not after it is refused.
    """
    expected = f"expected {DURATION_EXPECTED} after submission, or an ISO timestamp like 2030-01-31T18:00:00Z"
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return duration(value)
        except ValueError:
            if not isinstance(value, str) or _DURATION.match(value):
                raise
    if not isinstance(value, str):
        raise ValueError(f"{expected}, got {value!r}")
    try:
        at = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"{expected}, got {value!r}") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    if now is not None and at <= now:
        raise ValueError(f"the deadline {at.isoformat()} is in the past (it is now "
                         f"{now.astimezone(UTC).isoformat(timespec='seconds')}); give a future time "
                         f"or a duration like 6h")
    return at


def priority(value: Any) -> int:
    classes = ", ".join(f"{name} ({number})" for name, number in PRIORITY_CLASSES.items())
    expected = f"expected one of {classes} or a whole number >= 0"
    if isinstance(value, bool):
        raise ValueError(f"{expected}, got {value!r}")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in PRIORITY_CLASSES:
            return PRIORITY_CLASSES[text]
        if text.isdigit() and len(text) <= 12 and int(text) <= MAX_PRIORITY:
            return int(text)
    elif isinstance(value, int) and 0 <= value <= MAX_PRIORITY:
        return value
    if isinstance(value, int | str) and str(value).strip().isdigit():
        expected = f"expected a priority of at most {MAX_PRIORITY:,}"
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise ValueError(f"{expected}, got {shown}")


def max_price(value: Any) -> float:
    expected = "expected a price in USD per hour for the whole gang, a number > 0 (e.g. 12.5)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{expected}, got {value!r}")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{expected}, got {value!r}")
    return float(value)


def cloud_scope(value: Any) -> tuple[str, str | None]:
    """``aws`` or ``aws/us-east-1`` -> ``("aws", "us-east-1")``."""
    expected = f"expected a cloud ({', '.join(CLOUDS)}), optionally with a region as cloud/region"
    if not isinstance(value, str):
        raise ValueError(f"{expected}, got {value!r}")
    parts = value.strip().split("/")
    cloud = parts[0].lower()
    if cloud not in CLOUDS:
        raise ValueError(f"unknown cloud {parts[0]!r}; {expected}")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].strip()):
        raise ValueError(f"{expected}, got {value!r}")
    return cloud, parts[1].strip() if len(parts) == 2 else None


def signal_name(value: Any) -> str:
    """``SIGUSR1``, ``usr1`` or a signal number -> ``SIGUSR1``."""
    expected = "expected a signal name the job can catch, like SIGUSR1, SIGUSR2, SIGTERM or SIGINT"
    name: str | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            name = signal.Signals(value).name
        except ValueError:
            name = None
    elif isinstance(value, str):
        upper = value.strip().upper()
        name = upper if upper.startswith("SIG") else f"SIG{upper}"
    if name is None or name not in signal.Signals.__members__ or name in _UNCATCHABLE:
        raise ValueError(f"{expected}, got {value!r}")
    return name


def checkpoint_dir(value: Any) -> str:
    expected = "expected a local path or an s3://, gs:// or az:// URL"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{expected}, got {value!r}")
    text = value.strip()
    if len(text) > MAX_PATH_CHARS:
        raise ValueError(f"{expected} of at most {MAX_PATH_CHARS} characters, got {len(text)}")
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme.lower() not in CHECKPOINT_URL_SCHEMES:
            raise ValueError(f"{expected}; {scheme}:// is not supported, got {value!r}")
        if not rest.strip("/"):
            raise ValueError(f"{expected} naming a bucket, got {value!r}")
        return f"{scheme.lower()}://{rest}"
    return text


def team(value: Any) -> str:
    """A team as API tokens name one: letters, digits, '.', '_' and '-' (so no markup, escape or
    control character reaches a terminal, page or report from it)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a team name (a non-empty string), got {value!r}")
    if len(value.strip()) > MAX_TEAM_CHARS:
        raise ValueError(f"expected a team name of at most {MAX_TEAM_CHARS} characters, got {len(value.strip())}")
    if not TEAM_PATTERN.match(value.strip()):
        raise ValueError(f"expected a team name of letters, digits, '.', '_' or '-', got {value.strip()[:40]!r}")
    return value.strip()


def gpu_memory(value: Any) -> float:
    """GB of GPU memory per GPU share, for jobs that ask for a fraction of a GPU."""
    expected = "expected GB of GPU memory per GPU share, a number > 0 (e.g. 20)"
    if isinstance(value, str):
        text = value.strip().upper().removesuffix("GB").strip()
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{expected}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{expected}, got {value!r}")
    if not 0 < value <= 1024:
        raise ValueError(f"{expected} and at most 1024, got {value!r}")
    return float(value)
