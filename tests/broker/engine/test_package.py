"""The engine package's docstring is its map: it names every module of the package."""

from __future__ import annotations

import re
from pathlib import Path

import broker.engine


def test_the_engine_docstring_names_every_engine_module() -> None:
    modules = {p.stem for p in Path(broker.engine.__file__).parent.glob("*.py") if p.stem != "__init__"}
    named = set(re.findall(r"^- ``(\w+)``:", broker.engine.__doc__ or "", re.MULTILINE))
    assert named == modules
