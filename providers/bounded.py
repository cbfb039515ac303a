"""Reading an input file in bounded memory and time, whatever it is: ``/dev/zero``, a line with no end,
a small gzip that inflates to gigabytes. Each reader of a trace or a list goes through these."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol


class Readable(Protocol):
    def readline(self, size: int = -1, /) -> str: ...


# A line of any trace or list we read is far shorter; one longer is not such a file.
MAX_LINE_CHARS = 64 * 1024


def capped_bytes(path: Path, limit: int, refuse: Callable[[str], Exception]) -> bytes:
    """The file's bytes, at most ``limit`` of them (a device such as /dev/zero reports size 0: read,
    not asked); ``refuse(message)`` is raised beyond."""
    with path.open("rb") as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise refuse(f"{path}: more than {limit} bytes")
    return raw


def capped_lines(handle: Readable, source: str, refuse: Callable[[str], Exception],
                 max_chars: int, max_line_chars: int = MAX_LINE_CHARS) -> Iterator[str]:
    """The handle's lines, each read with a bound: a line over ``max_line_chars`` or more than
    ``max_chars`` in all (decompressed, for a gzipped file) raises ``refuse(message)`` naming the line."""
    total = 0
    for number in range(1, 2**62):
        line = handle.readline(max_line_chars + 1)
        if not line:
            return
        if len(line) > max_line_chars and not line.endswith("\n"):
            raise refuse(f"{source}:{number}: a line of more than {max_line_chars} characters")
        total += len(line)
        if total > max_chars:
            raise refuse(f"{source}:{number}: more than {max_chars} characters in all")
        yield line
