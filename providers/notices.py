"""Node-side preemption-notice readers: what a node's metadata service says about its own fate.

Each reader's ``poll()`` returns the notices present now (empty when none), returns promptly,
and never raises on a bad answer: a garbage response is logged once as a warning and read as
"no notice". ``acknowledge(notice)`` tells the cloud the node is ready to go (Azure's
``StartRequests``); clouds that need no answer ignore it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeNotice:
    kind: str  # terminate | stop | hibernate | rebalance | maintenance
    action_time: datetime | None
    raw: dict[str, Any] = field(default_factory=dict)


class NoticeReader(Protocol):
    cloud: str

    def poll(self) -> list[NodeNotice]: ...

    def acknowledge(self, notice: NodeNotice) -> None: ...


def parse_iso_time(text: str | None) -> datetime | None:
    if not text:
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


def reader_for(cloud: str, metadata_url: str | None) -> NoticeReader:
    """The reader for a cloud; the local cloud speaks the AWS format."""
    if cloud in ("aws", "local"):
        from providers.aws import AwsImdsReader

        return AwsImdsReader(metadata_url or "http://169.254.169.254")
    if cloud == "gcp":
        from providers.gcp import GcpMetadataReader

        return GcpMetadataReader(metadata_url or "http://metadata.google.internal")
    if cloud == "azure":
        from providers.azure import AzureScheduledEventsReader

        return AzureScheduledEventsReader(metadata_url or "http://169.254.169.254")
    raise ValueError(f"no notice reader for cloud {cloud!r}; expected aws, gcp, azure or local")
