"""What a node's metadata service can say about its own fate, as every cloud's notice reader returns it.

The readers (``providers.aws``, ``gcp``, ``azure``) share these types; ``providers.notices`` picks
the reader for a cloud.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger(__name__)

# How long before the node goes each cloud says so (AWS spot: 2 minutes; GCP preemption and Azure
# eviction: 30 s). A checkpoint that takes longer cannot be saved on the notice alone.
NOTICE_LEAD_SECONDS: dict[str, float] = {"aws": 120.0, "gcp": 30.0, "azure": 30.0, "local": 120.0}
# How often the node agent reads its cloud's notice by default, so a notice reaches the job well
# inside a second. GCP's reader long-polls (``wait_for_change``) in its own threads: reading what
# they heard costs no request. EC2's IMDS is a local link with a packet-rate limit far above 20
# requests a second (two paths each poll). Azure's IMDS throttles at 5 requests a second per VM.
NOTICE_POLL_SECONDS: dict[str, float] = {"aws": 0.1, "gcp": 0.05, "azure": 0.25, "local": 0.1}


@dataclass(frozen=True, slots=True)
class NodeNotice:
    kind: str  # terminate | stop | hibernate | rebalance | maintenance
    action_time: datetime | None
    raw: dict[str, Any] = field(default_factory=dict)


class NoticeReader(Protocol):
    cloud: str

    def poll(self) -> list[NodeNotice]: ...

    def acknowledge(self, notice: NodeNotice) -> None: ...


def parse_iso_time(text: object) -> datetime | None:
    """An ISO 8601 time from a metadata answer; None for anything else (a number, garbage)."""
    if not text or not isinstance(text, str):
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class OnceWarnings:
    """Log each distinct problem once, not on every poll."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._log = logger or log

    def warn(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        self._log.warning(message)
