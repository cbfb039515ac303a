"""The broker's checkpoint contract, kept for a training job by the job itself (standard library only).

The contract (see ``docs/checkpointing.md``):

- the checkpoint signal (``$BROKER_CHECKPOINT_SIGNAL``, SIGUSR1 by default) asks for a checkpoint;
- a checkpoint is written in full under a temporary name, renamed into place, and only then named
  by ``$BROKER_CHECKPOINT_DIR/LATEST`` (replaced atomically, with ``step=N``);
- ``BROKER_PROGRESS step=N total=M`` lines on the output tell how far the job has got;
- ``$BROKER_RESUME_FROM`` names the checkpoint to resume from (empty or unset: start fresh).

In a gang every rank calls :meth:`Checkpointer.should_save` at the same steps; with ``agree`` (an
any-reduce across ranks, which the framework integrations supply) a signal seen on any rank makes
every rank checkpoint at the same step. Only ``writer_rank`` writes the marker and the progress.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

MARKER = "LATEST"
MAX_MARKER_BYTES = 4096
MAX_STEP = 2**62
_NAME = re.compile(r"step-(\d{1,19})")

T = TypeVar("T")
Writer = Callable[[str], Any]


def say(message: str) -> None:
    """One line on the job's log (the node agent copies it to the attempt's log)."""
    print(f"broker.job: {message}", file=sys.stderr, flush=True)


def checkpoint_signal() -> signal.Signals:
    name = os.environ.get("BROKER_CHECKPOINT_SIGNAL", "SIGUSR1").strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        say(f"BROKER_CHECKPOINT_SIGNAL={name[:40]!r} is not a signal; using SIGUSR1")
        return signal.SIGUSR1


def env_rank() -> int:
    """This process's rank in the gang: torchrun's RANK, else the node's rank."""
    for name in ("RANK", "SKYPILOT_NODE_RANK"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def step_of(path: str | os.PathLike[str]) -> int | None:
    """The step in a checkpoint's name (``step-00000120``), or None."""
    match = _NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match and int(match.group(1)) <= MAX_STEP else None


def read_marker(directory: Path) -> tuple[Path, int | None] | None:
    """The checkpoint ``LATEST`` names, if it is a sane path inside ``directory``; None otherwise."""
    try:
        with (directory / MARKER).open("rb") as handle:
            raw = handle.read(MAX_MARKER_BYTES)
    except OSError:
        return None
    lines = raw.decode("utf-8", errors="replace").splitlines()
    first = lines[0].strip() if lines else ""
    if not first or "\x00" in first:
        say(f"{directory / MARKER} is empty or unreadable; ignoring it")
        return None
    path = inside(directory, first)
    if path is None:
        say(f"{directory / MARKER} names {first[:200]!r}, outside {directory}; ignoring it")
        return None
    if not os.path.exists(path):
        say(f"{directory / MARKER} names {first[:200]!r}, which does not exist; ignoring it")
        return None
    step: int | None = None
    for line in lines[1:]:
        key, _, value = line.partition("=")
        if key.strip() == "step":
            text = value.strip()
            step = int(text) if text.isdigit() and int(text) <= MAX_STEP else None
            if step is None:
                say(f"{directory / MARKER} has step={text[:40]!r}, not a step; reading the step from the name")
    return path, step if step is not None else step_of(path)


def inside(directory: Path, name: str) -> Path | None:
    """``name`` (absolute, or relative to ``directory``) resolved, if it lies inside ``directory``."""
    try:
        root = directory.resolve()
        path = (root / name).resolve()
    except (OSError, ValueError, RuntimeError):
        return None
    return path if path != root and root in path.parents else None


class Checkpointer:
    """Answers: was a checkpoint asked for, where to resume from, where to write; saves atomically.

    ``directory`` defaults to ``$BROKER_CHECKPOINT_DIR`` (``checkpoints`` outside the broker).
    ``every_steps`` adds periodic checkpoints. ``agree`` is an any-reduce of one flag across the
    gang and ``barrier`` waits for every rank (both identity when there is one rank).
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, every_steps: int | None = None,
                 total_steps: int | None = None, rank: int | None = None, writer_rank: int = 0, keep: int = 2,
                 agree: Callable[[bool], bool] | None = None, barrier: Callable[[], None] | None = None,
                 handle_signal: bool = True) -> None:
        if every_steps is not None and every_steps < 1:
            raise ValueError("every_steps must be at least 1")
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = Path(directory or os.environ.get("BROKER_CHECKPOINT_DIR") or "checkpoints")
        self.every_steps, self.total_steps, self.keep = every_steps, total_steps, keep
        self.rank = env_rank() if rank is None else rank
        self.writer_rank = writer_rank
        self.agree = agree
        self.barrier = barrier
        self.signal = checkpoint_signal()
        self.save_seconds: list[float] = []  # each completed save, in order
        self.resumed_from: Path | None = None
        self._asked = threading.Event()
        self._on_notice = False
        self._previous: Any = None
        if handle_signal:
            self.install_signal_handler()

    # -- the signal -------------------------------------------------------------------------
    def install_signal_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            say("not on the main thread: the checkpoint signal is not handled here")
            return
        self._previous = signal.signal(self.signal, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self._asked.set()
        if callable(self._previous):
            self._previous(signum, frame)

    def ask(self) -> None:
        """Ask for a checkpoint as the signal does (from any thread)."""
        self._asked.set()

    @property
    def asked(self) -> bool:
        """Whether a checkpoint was asked for on this rank and not yet taken."""
        return self._asked.is_set()

    # -- the decision -----------------------------------------------------------------------
    def should_save(self, step: int) -> bool:
        """Whether to checkpoint after ``step``. Every rank calls it at every step (it is collective
        when ``agree`` is set) and gets the same answer."""
        asked = self._asked.is_set()
        if self.agree is not None:
            asked = self.agree(asked)
        periodic = self.every_steps is not None and step > 0 and step % self.every_steps == 0
        if asked:
            self._asked.clear()
            self._on_notice = True
        return asked or periodic

    # -- resuming ---------------------------------------------------------------------------
    def resume_candidates(self) -> list[Path]:
        """Where to resume from, best first: ``$BROKER_RESUME_FROM`` then the older complete checkpoints
        in the directory. Empty when the broker starts the job fresh (or outside the broker)."""
        named = os.environ.get("BROKER_RESUME_FROM", "").strip()
        if not named:
            return []
        first = inside(self.directory, named)
        if first is None:
            say(f"BROKER_RESUME_FROM={named[:200]!r} is outside {self.directory}; not resuming from it")
        elif not os.path.exists(first):
            say(f"BROKER_RESUME_FROM={named[:200]!r} does not exist; not resuming from it")
            first = None
        limit = step_of(first) if first is not None else None
        older = [p for p in self.complete() if p != first and (limit is None or (step_of(p) or 0) < limit)]
        return ([first] if first is not None else []) + older

    def complete(self) -> list[Path]:
        """The complete checkpoints in the directory (named ``step-N``: only renames make those), newest first."""
        try:
            entries = list(self.directory.iterdir())
        except OSError:
            return []
        found = [(step, p) for p in entries if (step := step_of(p)) is not None]
        return [p for _, p in sorted(found, reverse=True)]

    def resume(self, load: Callable[[str], T]) -> T | None:
        """``load`` the newest checkpoint that loads, or None to start fresh. A checkpoint that fails to
        load is named on the log and the one before it is tried."""
        for path in self.resume_candidates():
            try:
                state = load(str(path))
            except Exception as exc:
                say(f"cannot resume from {path.name}: {type(exc).__name__}: {str(exc)[:300]}; trying an older one")
                continue
            self.resumed_from = path
            say(f"resuming from {path.name}")
            return state
        return None

    # -- saving -----------------------------------------------------------------------------
    def path_for(self, step: int) -> Path:
        return self.directory / f"step-{step:08d}"

    def partial_path(self, step: int) -> Path:
        return self.directory / f".step-{step:08d}.partial"

    def save(self, step: int, write: Writer, *, all_ranks: bool = False, started: float | None = None) -> bool:
        """Write checkpoint ``step`` with ``write(path)``, then name it in ``LATEST``.

        ``write`` gets a temporary path (a file or a directory it creates); it is renamed into place
        only once ``write`` returned. ``all_ranks``: every rank writes into that path (sharded state,
        e.g. ``torch.distributed.checkpoint``); otherwise only the writer rank writes. A save that
        fails is said on the log and leaves the last good checkpoint in place: training goes on.
        ``started`` (a ``time.perf_counter()``): when the save began, if before this call.
        """
        if not 0 <= step <= MAX_STEP:
            raise ValueError(f"step {step} is out of range")
        writes = all_ranks or self.rank == self.writer_rank
        started = time.perf_counter() if started is None else started
        partial = self.partial_path(step)
        ok = True
        if writes:
            ok = self._attempt(step, lambda: self._write(partial, write))
        if all_ranks and self.barrier is not None:
            self.barrier()
        if self.rank == self.writer_rank and ok:
            ok = self._attempt(step, lambda: self._publish(step, partial, time.perf_counter() - started))
        if all_ranks and self.barrier is not None:
            self.barrier()
        return ok

    def _write(self, partial: Path, write: Writer) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write(str(partial))

    def _publish(self, step: int, partial: Path, seconds: float) -> None:
        final = self.path_for(step)
        if not partial.exists():
            raise FileNotFoundError(f"the writer left nothing at {partial.name}")
        remove(final)
        os.replace(partial, final)
        self.write_marker(final.name, step, seconds)
        self.save_seconds.append(seconds)
        why = "on notice" if self._on_notice else "periodic"
        self._on_notice = False
        print(f"checkpoint {final.name} ({why}) saved in {seconds:.3f} s", flush=True)
        self.prune()

    def _attempt(self, step: int, action: Callable[[], None]) -> bool:
        try:
            action()
        except Exception as exc:
            say(f"checkpoint step {step} not saved: {type(exc).__name__}: {str(exc)[:300]}; "
                "the last complete checkpoint stays the resume point")
            remove(self.partial_path(step), quiet=True)
            return False
        return True

    def write_marker(self, name: str, step: int, seconds: float | None = None) -> None:
        """Replace ``LATEST`` atomically: the checkpoint ``name`` (relative to the directory) is complete."""
        tmp = self.directory / f".{MARKER}.{os.getpid()}.tmp"
        timing = f"save_seconds={seconds:.3f}\n" if seconds is not None else ""
        tmp.write_text(f"{name}\nstep={step}\n{timing}")
        os.replace(tmp, self.directory / MARKER)

    def prune(self) -> None:
        """Keep the newest ``keep`` checkpoints (and the one resumed from until a newer one is complete)."""
        for old in self.complete()[self.keep:]:
            remove(old)

    # -- progress ---------------------------------------------------------------------------
    def progress(self, step: int, total: int | None = None) -> None:
        """Say how far the job has got (the writer rank speaks for the gang)."""
        if self.rank != self.writer_rank:
            return
        total = total if total is not None else self.total_steps
        print(f"BROKER_PROGRESS step={step}" + (f" total={total}" if total else ""), flush=True)


def remove(path: Path, quiet: bool = False) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        if not quiet:
            say(f"cannot remove {path.name}: {exc}")
