"""Where the migrations live and which one is the newest, known without importing Alembic or SQLAlchemy."""

from __future__ import annotations

import functools
import re
from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
_REVISION = re.compile(r'^(revision|down_revision)\s*(?::[^=]*)?=\s*["\']([^"\']+)["\']', re.M)


@functools.cache
def head_revision() -> str | None:
    """The newest migration, read from the files' ``revision``/``down_revision`` lines without Alembic.

    None when the files do not name exactly one head (then Alembic itself decides).
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        for name, value in _REVISION.findall(path.read_text()):
            (revisions if name == "revision" else parents).add(value)
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None
