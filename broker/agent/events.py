"""The agent's event log: JSON lines beside the job saying what the agent saw and did, and when."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("broker.agent")


class EventLog:
    """JSON lines the agent writes beside the job: what it saw and when (wall clock)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()

    def write(self, event: str, **data: Any) -> None:
        record = {"event": event, "wall": time.time(), **data}
        log.info("%s %s", event, json.dumps(data, default=str))
        if self.path is None:
            return
        with self._lock, self.path.open("a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
