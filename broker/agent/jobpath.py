"""The job-side helper on the job's ``PYTHONPATH``: ``import broker.job`` works in every job, installed or not.

The agent copies ``broker/job`` (standard library only) into a folder of its own beside the run and
puts that folder first on the job's ``PYTHONPATH``. Only ``broker.job`` is there: the broker's own
dependencies never shadow the job's. Where the job's Python has the whole broker installed too, the
copied ``broker/__init__.py`` extends the package's path, so ``broker.*`` still imports from there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import broker.job

SHIM_INIT = ('"""The broker\'s job-side helper, put here by the node agent."""\n'
             "from pkgutil import extend_path\n\n__path__ = extend_path(__path__, __name__)\n")


def job_pythonpath(folder: Path) -> Path:
    """Fill ``folder`` with ``broker/job`` and return it (the entry for ``PYTHONPATH``)."""
    source = Path(broker.job.__file__ or "").parent
    package = folder / "broker"
    target = package / "job"
    target.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(SHIM_INIT)
    for module in source.glob("*.py"):
        tmp = target / f".{module.name}.{os.getpid()}"
        shutil.copyfile(module, tmp)
        os.replace(tmp, target / module.name)
    return folder


def with_pythonpath(env: dict[str, str], entry: Path) -> dict[str, str]:
    """``env`` with ``entry`` first on its ``PYTHONPATH`` (what was there stays after it)."""
    existing = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": os.pathsep.join([str(entry), *([existing] if existing else [])])}
