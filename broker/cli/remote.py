"""``launch``, ``status``, ``cancel`` and ``logs`` against a running ``broker serve`` (``--server``/BROKER_SERVER).

They print exactly what the embedded commands print; only where the answers come from differs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live

from broker.cli.app import UsageError, console
from broker.client import BrokerClient, ClientError
from broker.config import Settings, load_settings
from broker.joblogs import LogChunk, print_chunks
from broker.model import JobState
from broker.spec import read_job_file

ServerOption = Annotated[str | None, typer.Option("--server", help="URL of a `broker serve` (or BROKER_SERVER)")]
_NODE0 = re.compile(r"^attempt-(\d+)-node-0$")


def server_settings(config: Path | None, server: str | None) -> Settings | None:
    """The settings when a server is named (flag, environment or file); None to run embedded."""
    settings = load_settings(config, server=server)
    return settings if settings.server else None


@contextmanager
def connect(settings: Settings) -> Iterator[BrokerClient]:
    if settings.token is None:
        raise UsageError("--server needs an API token: set BROKER_TOKEN (`broker token create --team TEAM` makes one)")
    assert settings.server is not None
    client = BrokerClient(settings.server, settings.token.get_secret_value())
    try:
        yield client
    except ClientError as exc:
        raise UsageError(str(exc)) from None
    finally:
        client.close()


class _Progress:
    """The last line the job printed on node 0 of its latest attempt (what the embedded table shows)."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.attempt = 0
        self.line = ""

    def update(self, client: BrokerClient, job_id: str) -> None:
        for raw in client.logs(job_id, self.offsets)["chunks"]:
            chunk = LogChunk(**raw)
            self.offsets[chunk.file] = chunk.end
            match = _NODE0.match(chunk.file)
            if match is None or int(match.group(1)) < self.attempt:
                continue
            self.attempt = int(match.group(1))
            lines = [ln for ln in chunk.text.splitlines() if ln.strip() and not ln.startswith("[agent]")]
            if lines:
                self.line = lines[-1].strip()


def launch(settings: Settings, job_file: Path, detach: bool, as_json: bool) -> None:
    from broker.cli.jobs import _progress_table, announce, finish

    text = read_job_file(job_file)
    with connect(settings) as client:
        submitted = client.submit(text, str(job_file.resolve()))
        job_id = submitted["job_id"]
        announce(job_id, submitted["name"], submitted["num_nodes"], detach, as_json)
        if detach:
            return
        progress = _Progress()
        with Live(console=console, refresh_per_second=4, transient=False, auto_refresh=False) as live:
            while True:
                summary = client.job(job_id)
                if not as_json:
                    progress.update(client, job_id)
                    live.update(_progress_table(summary, progress.line), refresh=True)
                if JobState(summary["state"]).terminal:
                    break
                time.sleep(settings.poll_seconds)
        summary = _settled(client, summary)
    finish(summary, as_json)


def _settled(client: BrokerClient, summary: dict[str, Any], timeout: float = 15.0) -> dict[str, Any]:
    """The summary once teardown is metered: the cost stops moving (what embedded launch waits for too)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(1.0)
        again = client.job(summary["job_id"])
        if again == summary:
            break
        summary = again
    return summary


def summaries(settings: Settings, job_id: str | None) -> list[dict[str, Any]]:
    with connect(settings) as client:
        return [client.job(job_id)] if job_id is not None else client.jobs()


def cancel(settings: Settings, job_id: str) -> str:
    with connect(settings) as client:
        return str(client.cancel(job_id)["state"])


def logs(settings: Settings, job_id: str, follow: bool) -> None:
    offsets: dict[str, int] = {}
    with connect(settings) as client:
        while True:
            answer = client.logs(job_id, offsets)
            chunks = [LogChunk(**raw) for raw in answer["chunks"]]
            print_chunks(chunks, offsets)
            if chunks:
                continue  # more may be waiting past the page the server sent
            if not follow or JobState(answer["state"]).terminal:
                break
            time.sleep(0.5)
