"""The checkpoint contract's marker: a job marks a checkpoint complete by rewriting ``LATEST``.

``$BROKER_CHECKPOINT_DIR/LATEST`` holds the path (absolute, or relative to the directory) of the
newest complete checkpoint; a job writes the checkpoint first, then replaces ``LATEST`` atomically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MARKER = "LATEST"


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    path: str
    written_at: float  # epoch seconds (the marker's mtime)


def latest_checkpoint(directory: str | os.PathLike[str] | None) -> CheckpointMark | None:
    if not directory or "://" in str(directory):
        return None
    marker = Path(directory) / MARKER
    try:
        text = marker.read_text().strip()
        written = marker.stat().st_mtime
    except OSError:
        return None
    if not text:
        return None
    path = Path(text)
    if not path.is_absolute():
        path = Path(directory) / path
    return CheckpointMark(str(path), written)


def mark_complete(directory: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> None:
    """What a job calls after writing a checkpoint (used by the examples and tests)."""
    marker = Path(directory) / MARKER
    tmp = marker.with_name(f".{MARKER}.{os.getpid()}")
    tmp.write_text(str(checkpoint))
    os.replace(tmp, marker)
