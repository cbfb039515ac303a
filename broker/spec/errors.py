"""The one error a job file can raise."""

from __future__ import annotations

from broker.errors import UserError

MAX_MESSAGE_CHARS = 520  # a message quotes what was written: keep one line for a megabyte of it


def _clip(text: str) -> str:
    text = " ".join(text.split()) if "\n" in text else text
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 3] + "..."


class SpecError(UserError, ValueError):
    """An invalid job file. ``str()`` is the message shown to the user: ``source:line: field: message``."""

    def __init__(self, message: str, field: str | None = None, line: int | None = None,
                 source: str | None = None) -> None:
        message, field = _clip(message), _clip(field) if field else field
        self.field, self.line, self.source, self.detail = field, line, source, message
        where = source or "job file"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {field + ': ' if field else ''}{message}")
