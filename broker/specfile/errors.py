"""The one error a job file can raise."""

from __future__ import annotations


class SpecError(ValueError):
    """An invalid job file. ``str()`` is the message shown to the user: ``source:line: field: message``."""

    def __init__(self, message: str, field: str | None = None, line: int | None = None,
                 source: str | None = None) -> None:
        self.field, self.line, self.source, self.detail = field, line, source, message
        where = source or "job file"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {field + ': ' if field else ''}{message}")
