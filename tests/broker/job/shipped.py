"""What the framework tests share: the shipped example scripts, loaded as modules, and the process's end."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


class Died(Exception):
    """The process was taken away (what a preemption does to the training loop)."""


def load_example(script: str) -> ModuleType:
    """``examples/<script>.py`` as a module, so a test trains with the very code the example runs."""
    spec = importlib.util.spec_from_file_location(script, EXAMPLES / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
