"""Structured logs for the service: one JSON object per line when stderr is not a terminal.

Secrets never reach a log line: API tokens, bearer headers and agent tokens are masked by a
filter on the handler, whatever logger wrote them.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

_SECRETS = re.compile(r"(bkr_[A-Za-z0-9_-]{8,}|(?i:bearer)\s+\S+|\b[0-9a-f]{64}\b)")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "color_message"}


def redact(text: str) -> str:
    return _SECRETS.sub("***", text)


class RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, replica: str) -> None:
        super().__init__()
        self.replica = replica

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "replica": self.replica,
            "msg": record.getMessage(),
        }
        data.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            data["error"] = redact(self.formatException(record.exc_info))
        return json.dumps(data, default=str)


def configure_logging(replica: str, level: str = "INFO", as_json: bool | None = None) -> None:
    as_json = not sys.stderr.isatty() if as_json is None else as_json
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactSecrets())
    handler.setFormatter(JsonFormatter(replica) if as_json else
                         logging.Formatter(f"%(asctime)s %(levelname)s {replica} %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # An engine step outlasting its interval is skipped by design; APScheduler would warn on each.
    logging.getLogger("apscheduler.scheduler").setLevel(logging.ERROR)
    for noisy in ("apscheduler.executors.default", "alembic.runtime.migration"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
