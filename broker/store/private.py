"""Files only the broker's own user may read: the broker home, the SQLite store (it holds the key
agent tokens are derived from) and job logs. Another local user who could read the store could
compute a cluster's agent token and forge its notices."""

from __future__ import annotations

import os
from pathlib import Path

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600
# SQLite's side files: created with the database's own mode, tightened here when they already exist.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_directory(path: Path) -> Path:
    """Create ``path`` (and missing parents) readable by this user only; tighten it if it exists."""
    path.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    if (path.stat().st_mode & 0o777) != DIRECTORY_MODE:
        path.chmod(DIRECTORY_MODE)
    return path


def private_database(path: Path) -> None:
    """Create the SQLite file ``path`` readable by this user only, or tighten it and its side files."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    os.close(descriptor)
    for candidate in (path, *(Path(f"{path}{suffix}") for suffix in SQLITE_SIDE_FILES)):
        if candidate.exists() and (candidate.stat().st_mode & 0o777) != FILE_MODE:
            candidate.chmod(FILE_MODE)


def private_opener(path: str, flags: int) -> int:
    """For ``open(..., opener=private_opener)``: a new file is created readable by this user only."""
    return os.open(path, flags, FILE_MODE)
