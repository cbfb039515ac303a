"""How the agent tells the broker what it saw: JSON posts with the cluster's token, retried with backoff.

Three kinds of report share this: notices (``/v1/notices``), complete checkpoints
(``/v1/checkpoints``) and the job's progress (``/v1/progress``). A 4xx other than 429 is final (the
broker refused the report); anything else is retried until the report's own deadline.

The broker's address may be ``file://PATH``: the address is then read from PATH at every try. An
embedded engine writes where it listens there, and the engine started after it (say after a
``kill -9``) rewrites it, so reports retried across the restart reach the engine that is running.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

ADDRESS_FILE = "file://"
MAX_ADDRESS_BYTES = 512


def current_url(url: str) -> str:
    """``url`` itself, or for ``file://PATH/v1/ROUTE`` the address written in PATH followed by ``/v1/ROUTE``;
    OSError when PATH holds no http address (no engine has written one yet)."""
    if not url.startswith(ADDRESS_FILE):
        return url
    path, _, route = url[len(ADDRESS_FILE):].rpartition("/v1/")
    with open(path, "rb") as handle:
        base = handle.read(MAX_ADDRESS_BYTES).decode("ascii", errors="replace").strip()
    if not base.startswith(("http://", "https://")):
        raise OSError(f"{path}: no broker address in it")
    return base.rstrip("/") + "/v1/" + route


class Events(Protocol):
    def write(self, event: str, **data: Any) -> None: ...


class Delivery(Enum):
    TAKEN = "taken"
    REFUSED = "refused"  # a 4xx: sending it again would be refused again
    GAVE_UP = "gave_up"  # out of time with no answer: worth sending again later


def post_with_retry(url: str, token: str | None, payload: dict[str, Any], until: float, events: Events,
                    what: str, names: tuple[str, str, str] | None = None, **detail: Any) -> bool:
    """POST ``payload``; True once the broker took it, False when refused or out of time."""
    return post_until(url, token, payload, until, events, what, names, **detail) is Delivery.TAKEN


def post_until(url: str, token: str | None, payload: dict[str, Any], until: float, events: Events,
               what: str, names: tuple[str, str, str] | None = None, **detail: Any) -> Delivery:
    """POST ``payload``, retrying until the broker answers or ``until`` passes.

    The events written are ``<what>_reported``, ``<what>_refused`` and ``<what>_gave_up`` unless
    ``names`` gives others; ``detail`` goes with the first.
    """
    reported, refused, gave_up = names or (f"{what}_reported", f"{what}_refused", f"{what}_gave_up")
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    delay = 0.2
    while True:
        try:
            request = urllib.request.Request(current_url(url), data=body, method="POST", headers=headers)
            with urllib.request.urlopen(request, timeout=5) as response:
                events.write(reported, status=response.status, **detail)
                return Delivery.TAKEN
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500 and exc.code != 429:
                events.write(refused, status=exc.code, **detail)
                return Delivery.REFUSED
            problem = f"HTTP {exc.code}"
        except (OSError, urllib.error.URLError) as exc:
            problem = str(exc)
        if time.time() + delay > until:
            events.write(gave_up, problem=problem, **detail)
            return Delivery.GAVE_UP
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


class LatestOnly:
    """Sends the newest of a stream of reports from one background thread; older unsent ones are dropped."""

    def __init__(self, send: Callable[[dict[str, Any]], object]) -> None:
        self._send = send
        self._pending: dict[str, Any] | None = None
        self._busy = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def offer(self, payload: dict[str, Any]) -> None:
        with self._wake:
            self._pending = payload
            self._wake.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, daemon=True)
            self._thread.start()

    def flush(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until nothing is pending or being sent."""
        until = time.time() + timeout
        with self._wake:
            while (self._pending is not None or self._busy) and time.time() < until:
                self._wake.wait(timeout=max(until - time.time(), 0.0))

    def _drain(self) -> None:
        while True:
            with self._wake:
                while self._pending is None:
                    self._wake.wait()
                payload, self._pending, self._busy = self._pending, None, True
            try:
                self._send(payload)
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()
