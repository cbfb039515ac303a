"""Retrying a delivery: back off on transient failures, wait out a rate limit, stop on permanent ones."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.errors import BrokerError


class DeliveryError(BrokerError, RuntimeError):
    """A send that failed; ``transient`` ones are worth another attempt."""

    def __init__(self, message: str, transient: bool = True, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 4
    backoff_s: float = 2.0  # first wait; doubles on every retry
    max_wait_s: float = 300.0  # a Retry-After longer than this is a failure, not a stall


@dataclass
class Outcome:
    ok: bool
    attempts: int
    error: str | None = None


def with_retries(send: Callable[[], None], policy: RetryPolicy,
                 sleep: Callable[[float], None] = time.sleep) -> Outcome:
    delay = policy.backoff_s
    for attempt in range(1, policy.attempts + 1):
        try:
            send()
            return Outcome(True, attempt)
        except DeliveryError as exc:
            error = str(exc)
            if not exc.transient or attempt == policy.attempts:
                return Outcome(False, attempt, error)
            wait = exc.retry_after if exc.retry_after is not None else delay
            if wait > policy.max_wait_s:
                return Outcome(False, attempt, f"{error} (asked to wait {wait:.0f}s, more than "
                                               f"{policy.max_wait_s:.0f}s)")
            sleep(wait)
            if exc.retry_after is None:
                delay *= 2
    raise AssertionError("unreachable: the loop returns on its last attempt")
