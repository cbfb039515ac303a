"""What every cloud poller shares: retries with backoff and jitter, JSON over HTTP, fan-out.

The cloud SDKs are synchronous, so concurrency is threads: one per region (or per listing) within
a cloud, and the broker runs the clouds side by side.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from providers.base import ProviderError

T = TypeVar("T")
R = TypeVar("R")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

# Called as progress(done, total) each time a unit of a poll (a region, a listing) finishes.
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(cap, base * 2**n))."""

    attempts: int = 6
    base_seconds: float = 0.5
    max_seconds: float = 20.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_seconds, self.base_seconds * (2**attempt)))


class HttpStatusError(ProviderError, RuntimeError):
    """An HTTP answer that was not 2xx; ``retry_after`` is the server's hint in seconds, if any."""

    def __init__(self, url: str, status: int, body: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status} from {_short(url)}: {body[:200]}")
        self.url = url
        self.status = status
        self.retry_after = retry_after


_rng = random.Random()
_rng_lock = threading.Lock()


def with_retries(
    call: Callable[[], T],
    retryable: Callable[[BaseException], bool],
    backoff: Backoff,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``call``; on an error ``retryable`` accepts, wait and try again up to ``backoff.attempts``."""
    for attempt in range(backoff.attempts):
        try:
            return call()
        except Exception as exc:
            if attempt == backoff.attempts - 1 or not retryable(exc):
                raise
            with _rng_lock:
                wait = backoff.delay(attempt, _rng)
            hint = getattr(exc, "retry_after", None)
            if isinstance(hint, (int, float)) and hint > 0:
                wait = max(wait, min(float(hint), backoff.max_seconds))
            sleep(wait)
    raise AssertionError("unreachable: the last attempt either returns or raises")


def http_retryable(exc: BaseException) -> bool:
    import httpx

    if isinstance(exc, HttpStatusError):
        return exc.status in RETRYABLE_STATUS
    return isinstance(exc, httpx.TransportError)


class JsonHttp:
    """GET JSON documents with retries; one pooled client shared by the threads of one poll."""

    def __init__(self, backoff: Backoff, timeout: float = 30.0, headers: dict[str, str] | None = None) -> None:
        import httpx

        self.backoff = backoff
        self._client = httpx.Client(timeout=timeout, headers=headers or {},
                                    limits=httpx.Limits(max_connections=32, max_keepalive_connections=32))

    def get(self, url: str, params: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Any:
        def once() -> Any:
            response = self._client.get(url, params=params, headers=headers)
            if response.status_code >= 300:
                raise HttpStatusError(url, response.status_code, response.text,
                                      _retry_after(response.headers.get("retry-after")))
            return response.json()

        return with_retries(once, http_retryable, self.backoff)

    def close(self) -> None:
        self._client.close()


def fan_out(fn: Callable[[T], R], items: Iterable[T], max_workers: int = 16,
            progress: Progress | None = None) -> list[R]:
    """``[fn(x) for x in items]`` on threads, in the order given; the first error propagates."""
    work = list(items)
    if not work:
        return []
    done = 0
    lock = threading.Lock()

    def run(item: T) -> R:
        nonlocal done
        result = fn(item)
        if progress is not None:
            with lock:
                done += 1
                progress(done, len(work))
        return result

    with ThreadPoolExecutor(max_workers=min(max_workers, len(work))) as pool:
        return list(pool.map(run, work))


def chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _short(url: str) -> str:
    return url.split("?", 1)[0]
