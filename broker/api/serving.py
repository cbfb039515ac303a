"""How the broker's HTTP servers hold connections: time limits on a request's headers and body, and a
bound on open connections, so slow or half-sent requests cannot use up the process's descriptors.

uvicorn closes a connection only when it is idle between requests; one that sends a byte every few
seconds, or sends headers and then never its body, is held forever. ``guarded_protocol`` adds:

- a request's line and headers must arrive within ``header_timeout_s`` of the connection opening
  (or of the previous response), its body within ``body_timeout_s`` of the headers; else closed;
- at most ``max_connections_per_client`` open connections from one address (more are closed as
  they arrive);
- at most ``max_connections`` in all: past it the connection that has waited longest for its
  headers is closed to make room, else the new one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0  # 2 MB in 30 s: a client slower than 70 KB/s is not served
    idle_timeout_s: float = 5.0  # between requests on a kept-alive connection
    max_connections_per_client: int = 64
    max_connections: int = 768  # below the usual 1,024 descriptors, leaving room for the store and logs


class _GuardedH11Protocol(H11Protocol):
    limits = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._awaiting_headers_since: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        host = self.client[0] if self.client else None
        same_client = sum(1 for other in self.connections
                          if isinstance(other, _GuardedH11Protocol) and other.client and other.client[0] == host)
        if host is not None and same_client > limits.max_connections_per_client:
            transport.close()
            return
        if len(self.connections) > limits.max_connections and not self._evict_oldest_waiting():
            transport.close()
            return
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self._awaiting_headers_since = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        self._after_events(cycle)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()
        if not self.transport.is_closing():
            if self.cycle is cycle:
                self._await_headers()
            else:  # a pipelined request was waiting: its headers are in
                self._await_body()

    def _after_events(self, cycle: object) -> None:
        if self.cycle is not cycle and self.cycle is not None and not self.transport.is_closing():
            self._await_body()
        elif self.conn.their_state is h11.DONE and self._awaiting_headers_since is None:
            self._cancel_deadline()  # the whole request is in: its time budget is the app's

    def _await_headers(self) -> None:
        self._awaiting_headers_since = time.monotonic()
        self._arm(self.limits.header_timeout_s)

    def _await_body(self) -> None:
        self._awaiting_headers_since = None
        if self.conn.their_state is h11.DONE:
            self._cancel_deadline()
        else:
            self._arm(self.limits.body_timeout_s)

    def _arm(self, seconds: float) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._awaiting_headers_since is not None or self.conn.their_state is h11.SEND_BODY:
            self.transport.close()

    def _evict_oldest_waiting(self) -> bool:
        waiting = [other for other in self.connections if isinstance(other, _GuardedH11Protocol)
                   and other is not self and other._awaiting_headers_since is not None]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda other: other._awaiting_headers_since or 0.0)
        oldest.transport.close()
        self.connections.discard(oldest)
        return True


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with ``limits`` on how long and how many connections are held."""
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), {"limits": limits})


def server_config(app: Any, limits: ConnectionLimits | None = None, **options: Any) -> uvicorn.Config:
    """The uvicorn settings every broker server uses (the service, the embedded API, the dashboard)."""
    chosen = limits or ConnectionLimits()
    return uvicorn.Config(app, http=guarded_protocol(chosen), timeout_keep_alive=max(1, round(chosen.idle_timeout_s)),
                          lifespan="off", access_log=False, **options)
