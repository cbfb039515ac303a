"""``python -m broker.agent [options] -- COMMAND ARGS...``: run a job under the node agent.

The cluster's agent token comes from ``--token-file`` (a file only its owner may read) or the
``BROKER_AGENT_TOKEN`` variable, never from the command line, where every user of the node could
read it in ``ps``. The variable is removed before the job starts, so the job does not inherit it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import stat
import sys
from pathlib import Path

from broker.agent.node import AgentOptions, run_agent
from providers.base import CLOUDS


def _signal(name: str) -> signal.Signals:
    try:
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected a signal name such as SIGUSR1, got {name!r}") from None


def _seconds(text: str) -> float:
    """``1s``, ``200ms`` or a bare number of seconds."""
    value = text.strip().lower()
    scale = 0.001 if value.endswith("ms") else 1.0
    try:
        seconds = float(value.removesuffix("ms").removesuffix("s")) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration such as 1s or 200ms, got {text!r}") from None
    if not 0 < seconds <= 3600:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a duration above 0 and at most 1 hour, got {text[:40]!r}")
    return seconds


TOKEN_VARIABLE = "BROKER_AGENT_TOKEN"
MAX_TOKEN_BYTES = 512


def read_token(path: str | None) -> str | None:
    """The token from ``path`` (refused when others may read it) or from the environment."""
    from_env = os.environ.pop(TOKEN_VARIABLE, None)
    if path is None:
        return from_env or None
    file = Path(path)
    try:
        mode = file.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SystemExit(f"--token-file {path}: readable by others (mode {stat.S_IMODE(mode):o}); "
                             "expected 600")
        with file.open("rb") as handle:
            token = handle.read(MAX_TOKEN_BYTES + 1).decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"--token-file {path}: cannot read the token: {exc}") from None
    if not token or len(token) > MAX_TOKEN_BYTES:
        raise SystemExit(f"--token-file {path}: expected one token of at most {MAX_TOKEN_BYTES} characters")
    return token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.agent", description=__doc__)
    parser.add_argument("--cloud", default="auto", choices=[*CLOUDS, "auto"])
    parser.add_argument("--metadata-url", help="base of the metadata service (default: the cloud's)")
    parser.add_argument("--broker-url", help="where to report notices (POST /v1/notices)")
    parser.add_argument("--token-file", help=f"file holding this cluster's agent token, mode 600 "
                                             f"(default: ${TOKEN_VARIABLE})")
    parser.add_argument("--signal", type=_signal, default=signal.SIGUSR1, help="checkpoint signal")
    parser.add_argument("--poll", type=_seconds, default=1.0, help="how often to read the job's progress and "
                        "checkpoints, e.g. 1s or 200ms")
    parser.add_argument("--notice-poll", type=_seconds, default=None,
                        help="how often to read the cloud's preemption notice (default: aws 100ms, gcp 50ms "
                             "while its long-poll waits, azure 250ms, under its IMDS limit of 5 a second)")
    parser.add_argument("--cluster-id", default="")
    parser.add_argument("--node", default="0")
    parser.add_argument("--checkpoint-dir", help="default: $BROKER_CHECKPOINT_DIR")
    parser.add_argument("--gpu-sample", type=_seconds, default=5.0, help="how often to read the job's GPUs")
    parser.add_argument("--gpu-report", type=_seconds, default=60.0, help="how often to send their minutes")
    parser.add_argument("--status-file", help="write the exit code and the agent's events here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("expected a command after --")
    token = read_token(args.token_file)
    logging.basicConfig(level=logging.INFO, format="[agent] %(levelname)s %(message)s", stream=sys.stderr)
    return run_agent(AgentOptions(
        command=command, cloud=args.cloud, metadata_url=args.metadata_url, broker_url=args.broker_url,
        token=token, checkpoint_signal=args.signal, poll_seconds=args.poll, cluster_id=args.cluster_id,
        notice_poll_seconds=args.notice_poll,
        node=args.node, checkpoint_dir=args.checkpoint_dir, status_file=args.status_file,
        gpu_sample_s=args.gpu_sample, gpu_report_s=args.gpu_report,
    ))


if __name__ == "__main__":
    sys.exit(main())
