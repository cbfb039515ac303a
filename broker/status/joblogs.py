"""A job's output files (every attempt and node), read incrementally: for ``broker logs`` and the API."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class LogChunk:
    file: str  # e.g. attempt-2-node-0
    start: int  # byte offsets in the file
    end: int
    text: str


def log_files(home: Path, job_id: str) -> list[Path]:
    """The job's log files in order: by attempt, then node."""
    return sorted((home / "logs" / job_id).glob("attempt-*.log"), key=lambda p: (int(p.name.split("-")[1]), p.name))


def read_new(home: Path, job_id: str, offsets: dict[str, int], limit: int = MAX_CHUNK_BYTES,
             total: int | None = None) -> list[LogChunk]:
    """What each file holds past its offset in ``offsets``: at most ``limit`` bytes per file and ``total``
    in all (the files after are left for the next read, whose offsets say where this one stopped)."""
    chunks: list[LogChunk] = []
    left = total
    for path in log_files(home, job_id):
        if left is not None and left <= 0:
            break
        start = offsets.get(path.stem, 0)
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read(limit if left is None else min(limit, left))
        if data:
            chunks.append(LogChunk(path.stem, start, start + len(data), data.decode(errors="replace")))
            left = None if left is None else left - len(data)
    return chunks


def print_chunks(chunks: list[LogChunk], offsets: dict[str, int]) -> None:
    """Print each chunk's lines as ``[file] line`` and move the offsets past them."""
    for chunk in chunks:
        offsets[chunk.file] = chunk.end
        for line in chunk.text.splitlines():
            print(f"[{chunk.file}] {line}")
