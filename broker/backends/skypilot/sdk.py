"""What the SkyPilot backend reads from the SDK: one request and the wait for its result, and the
fields of the records ``sky.status`` and ``sky.queue`` answer with (objects or mappings by version)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from broker.backends.base import RunPhase

# SkyPilot's job states, as RunPhase.
RUN_PHASES = {
    "INIT": RunPhase.RUNNING, "PENDING": RunPhase.RUNNING, "SETTING_UP": RunPhase.RUNNING,
    "RUNNING": RunPhase.RUNNING, "SUCCEEDED": RunPhase.SUCCEEDED, "FAILED": RunPhase.FAILED,
    "FAILED_SETUP": RunPhase.START_FAILED, "FAILED_DRIVER": RunPhase.FAILED, "CANCELLED": RunPhase.FAILED,
}


@dataclass
class Request:
    """One SDK call and the wait for its result, in a daemon thread."""

    what: str
    started: float = field(default_factory=time.monotonic)
    request_id: str | None = None
    result: Any = None
    error: BaseException | None = None
    finished: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def failed(self) -> bool:
        return self.done.is_set() and self.error is not None


def record_field(record: Any, name: str, default: Any = None) -> Any:
    if isinstance(record, dict):
        return record.get(name, default)
    return getattr(record, name, default)


def enum_name(value: Any) -> str:
    return str(getattr(value, "name", value)).split(".")[-1].upper()


def instance_ids(handle: Any) -> list[str]:
    """The cloud instance ids in a SkyPilot cluster handle (``cached_cluster_info.instances``)."""
    info = record_field(handle, "cached_cluster_info")
    instances = record_field(info, "instances") if info is not None else None
    return sorted(str(k) for k in instances) if isinstance(instances, dict) else []
