"""The shell scripts a local node runs: its variables in a private file, then ``setup`` and ``run``,
as SkyPilot runs a task's (``setup`` a process of its own)."""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

START_FAILED = "start_failed"  # a node's note that its setup (or cd) failed, so ``run`` never began
# Linux's limit on one string of an exec's arguments or environment (MAX_ARG_STRLEN).
MAX_EXPORTED_BYTES = 128 * 1024


def private_file(path: Path, text: str) -> Path:
    """Write ``text`` to a file only its owner may read (created so, never widened after)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    return path


def env_file(node_dir: Path, variables: dict[str, str]) -> Path:
    """The node's variables, as a private shell file its scripts source."""
    lines = []
    for name, value in variables.items():
        if not name.isidentifier():
            continue
        if len(name) + len(value) + 2 > MAX_EXPORTED_BYTES:
            # Linux refuses to exec anything whose environment holds a string this long, so the
            # variable is the job script's own and its commands do not inherit it.
            lines.append(f"{name}={shlex.quote(value)}\n")
            warning = (f"[broker] {name} holds {len(value)} bytes, over the {MAX_EXPORTED_BYTES} an exported "
                       "variable may: set in the job script, not exported")
            lines.append(f"echo {shlex.quote(warning)} >&2\n")
        else:
            lines.append(f"export {name}={shlex.quote(value)}\n")
    return private_file(node_dir / "env.sh", "".join(lines))


def setup_script(node_dir: Path, head: list[str], workdir: Path, setup: str) -> Path:
    # As on SkyPilot, setup is a process of its own: what it exports or where it cds stays there.
    lines = [*head, "set -e", f"cd {shlex.quote(str(workdir))}", setup, ""]
    return private_file(node_dir / "setup.sh", "\n".join(lines))


def script_head(node_dir: Path, signal_name: str, variables: dict[str, str]) -> list[str]:
    return [f"trap '' {signal_name.removeprefix('SIG')}", f". {shlex.quote(str(env_file(node_dir, variables)))}"]


def job_script(node_dir: Path, signal_name: str, workdir: Path, setup: str | None, run: str,
               variables: dict[str, str]) -> Path:
    """The node's shell script: its variables (from a private file), then ``setup`` and ``run``."""
    failed = shlex.quote(str(node_dir / START_FAILED))
    where = shlex.quote(str(workdir))
    head = script_head(node_dir, signal_name, variables)
    # Until ``run`` begins, a failure is the start's, not the job's: it is written down as such.
    steps = [f"cd {where} || {{ echo {shlex.quote(f'cannot enter the working directory {workdir}')} > {failed}; "
             "exit 1; }"]
    if setup:
        setup_file = setup_script(node_dir, head, workdir, setup)
        steps.append(f"bash {shlex.quote(str(setup_file))} || {{ code=$?; "
                     f'echo "setup exited with code $code" > {failed}; exit $code; }}')
    return private_file(node_dir / "job.sh", "\n".join([*head, *steps, "set -e", run, ""]))
