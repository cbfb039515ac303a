"""Whether a job's process group catches a signal yet, read from ``/proc`` (Linux, proc(5)).

A job that is still importing its framework has not installed its checkpoint handler: a signal
whose default action terminates would kill it, turning a recoverable preemption into a crash. The
agent asks here before it sends one. A process catches signal N when bit N-1 of the ``SigCgt``
mask in ``/proc/<pid>/status`` is set; an ignored signal (a wrapper shell's ``trap ''``, inherited
by the processes it starts) is in ``SigIgn`` instead and does not count: sending it would be lost.

``python -m broker.agent.catching PGID_FILE SIGNAL`` sends one signal that way, for a request that
comes from outside the agent (the broker's periodic checkpoint request on a SkyPilot node).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

# Signals whose default action is not to terminate the process (signal(7)): they are sent as they are.
HARMLESS_BY_DEFAULT = frozenset({
    signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH,
    signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
})

PID_MAX_LIMIT = 1 << 22  # the most a pid (and so a process group id) can be on Linux


def terminates_by_default(signum: signal.Signals) -> bool:
    return signum not in HARMLESS_BY_DEFAULT


def _group_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read(4096)
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()  # the name in parentheses may hold spaces
    if len(fields) < 3 or fields[0] == b"Z":  # a zombie has no handlers left
        return None
    try:
        return int(fields[2])
    except ValueError:
        return None


def _caught_mask(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def group_catches(pgid: int, signum: signal.Signals) -> bool | None:
    """Whether a process of group ``pgid`` catches ``signum``; None where ``/proc`` cannot tell.

    None means "send as before": no ``/proc`` (not Linux), or no process of the group readable there.
    """
    if not os.path.isfile("/proc/self/status"):
        return None
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    bit = 1 << (int(signum) - 1)
    seen = False
    for entry in entries:
        if not entry.isdigit() or _group_of(entry) != pgid:
            continue
        mask = _caught_mask(entry)
        if mask is None:
            continue
        seen = True
        if mask & bit:
            return True
    return False if seen else None


def may_send(pgid: int, signum: signal.Signals) -> bool:
    """False only when sending ``signum`` to ``pgid`` would hit a group where nothing catches it."""
    if not terminates_by_default(signum):
        return True
    with contextlib.suppress(OSError):
        return group_catches(pgid, signum) is not False
    return True


def main(argv: list[str]) -> int:
    """Send SIGNAL to the process group named in PGID_FILE, unless nothing there catches it yet."""
    if len(argv) != 2:
        print("usage: python -m broker.agent.catching PGID_FILE SIGNAL", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as handle:
            text = handle.read(65)
        pgid = int(text.strip()) if len(text) <= 64 else 0
        if not 1 < pgid <= PID_MAX_LIMIT:
            raise ValueError
    except (OSError, ValueError):
        print(f"{argv[0]!r}: expected a process group id", file=sys.stderr)
        return 2
    name = argv[1].upper()
    try:
        signum = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except KeyError:
        print(f"signal: expected a signal name such as SIGUSR1, got {argv[1][:40]!r}", file=sys.stderr)
        return 2
    if not may_send(pgid, signum):
        print(f"no process of group {pgid} catches {signum.name} yet: not signalled")
        return 0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
