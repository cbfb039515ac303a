"""What the capacity pollers share: a request throttle, an answer cache, a bounded JSON POST and
checks of each field a cloud's capacity answer carries.

Capacity signals (GCP ``advice.capacity``, Azure Spot Placement Score) are asked per instance type
and region, so a refresh of every GPU type is hundreds of requests: the throttle keeps them inside
the clouds' quotas and the cache answers a repeat within ``ttl_s`` without a request. A field that
is missing, not a number, NaN/inf or out of range is refused alone, with a note naming it; the
rest of the answer, and the prices, are kept.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from providers.base import ProviderError
from providers.fetching import Backoff, HttpStatusError, http_retryable, with_retries

MAX_BODY_BYTES = 2 * 1024 * 1024  # a capacity answer is a few KB; anything this big is not one
MAX_NOTES = 20  # notes a poll keeps about refused fields (the first ones; a count of the rest)
MAX_UPTIME_S = 366 * 86400.0  # an "estimated uptime" beyond a year is not an estimate
_DURATION = re.compile(r"(\d{1,12})(\.\d{1,9})?s")


class FieldRefused(ProviderError, ValueError):
    """One field of a capacity answer was unusable; the message names it."""


class BodyRefused(ProviderError, ValueError):
    """A capacity answer that was not a JSON document of bounded size."""


def probability(value: Any, field: str) -> float:
    """A 0-1 score: a finite JSON number (not a bool) in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldRefused(f"{field}: not a number ({_show(value)})")
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise FieldRefused(f"{field}: out of range 0-1 ({_show(value)})")
    return number


def duration_s(value: Any, field: str) -> float:
    """A protobuf Duration in its JSON form (``"3600s"``, ``"1.5s"``), at most a year, in seconds."""
    if not isinstance(value, str) or not _DURATION.fullmatch(value):
        raise FieldRefused(f"{field}: not a duration like \"3600s\" ({_show(value)})")
    seconds = float(value[:-1])
    if seconds > MAX_UPTIME_S:
        raise FieldRefused(f"{field}: out of range, over a year ({_show(value)})")
    return seconds


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_body(raw: bytes, max_bytes: int = MAX_BODY_BYTES) -> Any:
    """A JSON document of at most ``max_bytes``; NaN/Infinity literals and deep nesting are refused."""
    if len(raw) > max_bytes:
        raise BodyRefused(f"answer over {max_bytes} bytes")

    def no_constant(name: str) -> Any:
        raise BodyRefused(f"answer has a bare {name}")

    try:
        return json.loads(raw, parse_constant=no_constant)
    except (RecursionError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, BodyRefused):
            raise
        raise BodyRefused(f"answer is not JSON ({type(exc).__name__})") from None


class Throttle:
    """At most one request start per ``interval_s`` across the threads of a poller."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._sleep = sleep
        self._next = -math.inf
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval_s
        if start > now:
            self._sleep(start - now)


class TtlCache:
    """Answers by request, each good for ``ttl_s``; at most ``max_entries`` (the oldest go first)."""

    def __init__(self, ttl_s: float, max_entries: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or self._clock() - entry[0] > self.ttl_s:
                return None
            return entry[1]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._entries[key] = (self._clock(), value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


class Notes:
    """The notes of one poll: each once, the first ``MAX_NOTES``, then a count of the rest."""

    def __init__(self, into: list[str]) -> None:
        self.into = into
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        with self._lock:
            if line in self.into:
                return
            if len(self.into) < MAX_NOTES:
                self.into.append(line)
            else:
                self.dropped += 1

    def close(self, cloud: str) -> None:
        if self.dropped:
            self.into.append(f"{cloud}: {self.dropped} more capacity notes left out")


def post_json(url: str, body: dict[str, Any], headers: dict[str, str], backoff: Backoff, throttle: Throttle,
              timeout: float = 30.0, max_bytes: int = MAX_BODY_BYTES) -> Any:
    """POST ``body`` and read a bounded JSON answer: throttled, and retried on 429/5xx and transport errors."""
    import httpx

    def once() -> Any:
        throttle.wait()
        with httpx.Client(timeout=timeout) as client, client.stream(
                "POST", url, json=body, headers={"Content-Type": "application/json", **headers}) as response:
            raw = bytearray()
            for chunk in response.iter_bytes():
                raw += chunk
                if len(raw) > max_bytes:
                    raise BodyRefused(f"answer over {max_bytes} bytes")
            if response.status_code >= 300:
                raise HttpStatusError(url, response.status_code, raw[:400].decode("utf-8", "replace"),
                                      _retry_after(response.headers.get("retry-after")))
            return parse_body(bytes(raw), max_bytes)

    return with_retries(once, http_retryable, backoff)


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def failure(exc: BaseException) -> str:
    """One short line for a capacity request that failed."""
    if isinstance(exc, HttpStatusError):
        return f"HTTP {exc.status}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:160]
