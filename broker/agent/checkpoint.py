"""The checkpoint contract's marker: a job marks a checkpoint complete by rewriting ``LATEST``.

``$BROKER_CHECKPOINT_DIR/LATEST`` holds the path (absolute, or relative to the directory) of the
newest complete checkpoint on its first line; a job writes the checkpoint first, then replaces
``LATEST`` atomically. Lines after the first may say ``step=N``: the training step the checkpoint
holds, which the agent reports with it, and ``save_seconds=S`` how long the job measured the save to take.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MARKER = "LATEST"
MAX_MARKER_BYTES = 4096


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    path: str
    written_at: float  # epoch seconds (the marker's mtime)
    step: int | None = None
    save_seconds: float | None = None  # how long the job measured the save to take


MAX_SAVE_SECONDS = 24 * 3600.0


def latest_checkpoint(directory: str | os.PathLike[str] | None) -> CheckpointMark | None:
    if not directory or "://" in str(directory):
        return None
    marker = Path(directory) / MARKER
    try:
        with marker.open("rb") as handle:
            raw = handle.read(MAX_MARKER_BYTES)
        written = marker.stat().st_mtime
    except OSError:
        return None
    lines = raw.decode("utf-8", errors="replace").splitlines()
    first = lines[0].strip() if lines else ""
    if not first or "\x00" in first:
        return None
    path = Path(first)
    if not path.is_absolute():
        path = Path(directory) / path
    return CheckpointMark(str(path), written, _step(lines[1:]), _save_seconds(lines[1:]))


def _save_seconds(lines: list[str]) -> float | None:
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "save_seconds":
            try:
                seconds = float(value.strip()[:32])
            except ValueError:
                return None
            return seconds if 0 <= seconds <= MAX_SAVE_SECONDS else None  # NaN fails both
    return None


def _step(lines: list[str]) -> int | None:
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "step":
            try:
                step = int(value.strip())
            except ValueError:
                return None
            return step if 0 <= step <= 2**62 else None
    return None
