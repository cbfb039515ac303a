"""``launch``, ``status``, ``cancel`` and ``logs`` against a running ``broker serve`` (``--server``/BROKER_SERVER).

They print exactly what the embedded commands print; only where the answers come from differs.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.cli.app import UsageError
from broker.cli.job_output import announce, finish, progress_table

if TYPE_CHECKING:
    from broker.cli.client import BrokerClient

ServerOption = Annotated[str | None, typer.Option("--server", envvar="BROKER_SERVER", show_envvar=True,
                                                  help="URL of a `broker serve` to talk to instead of the "
                                                       "embedded broker")]
_NODE0 = re.compile(r"^attempt-(\d+)-node-0$")
_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})  # broker.model.TERMINAL_STATES


@dataclass(frozen=True)
class Served:
    """Where the CLI's requests go: the service's URL and the API token (None: not configured)."""

    url: str
    token: str | None
    poll_seconds: float = 0.2


def server_settings(config: Path | None, server: str | None) -> Served | None:
    """The service to talk to when one is named (flag, BROKER_SERVER or the settings file); None: run embedded.

    Read without the full settings model (pydantic-settings alone costs a few hundred ms to import),
    in the same order of precedence: flag, then environment, then file.
    """
    file_values = read_settings_file(config)
    url = server or os.environ.get("BROKER_SERVER") or text_setting(file_values, "server")
    if not url:
        return None
    if len(url) > 2048 or "\x00" in url:
        raise UsageError("--server: expected a URL like http://127.0.0.1:8470 (at most 2048 characters)")
    token = os.environ.get("BROKER_TOKEN") or text_setting(file_values, "token")
    return Served(url=url, token=token or None)


def full_settings(config: Path | None, served: Served) -> Served:
    """``served`` with the polling interval of the full settings (for an attached launch)."""
    from broker.config.settings import load_settings

    return Served(served.url, served.token, load_settings(config, server=served.url).poll_seconds)


def read_settings_file(config: Path | None) -> dict[str, Any]:
    """The settings file's mapping (``--config``, or config.yaml in the broker home), {} when there is none."""
    if config is not None and not config.exists():
        raise UsageError(f"--config {config}: no such file")
    home = Path(os.environ.get("BROKER_HOME") or Path.home() / ".broker")
    path = config or home / "config.yaml"
    if not path.exists():
        return {}
    from broker.config.file import ConfigError, read_settings_file

    try:
        return read_settings_file(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def text_setting(values: dict[str, Any], key: str) -> str | None:
    value = values.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"settings file: {key}: expected a string, got {type(value).__name__}")
    return value


@contextmanager
def connect(settings: Served) -> Iterator[BrokerClient]:
    from broker.cli.client import BrokerClient, ClientError

    if settings.token is None:
        raise UsageError("--server needs an API token: set BROKER_TOKEN (`broker token create --team TEAM` makes one)")
    try:
        client = BrokerClient(settings.url, settings.token)
    except ClientError as exc:
        raise UsageError(str(exc)) from None
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
        from broker.status.joblogs import LogChunk

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


def launch(settings: Served, job_file: Path, detach: bool, as_json: bool) -> None:
    from broker.spec.job import read_job_file

    text = read_job_file(job_file)
    if _documents(text, str(job_file)) > 1:
        return _launch_pipeline(settings, text, job_file, detach, as_json)
    with connect(settings) as client:
        submitted = client.submit(text, str(job_file.resolve()))
        job_id = submitted["job_id"]
        announce(job_id, submitted["name"], submitted["num_nodes"], detach, as_json)
        if detach:
            return
        _follow(settings, client, [job_id], as_json)
        summary = _settled(client, client.job(job_id))
    finish(summary, as_json)


def _documents(text: str, source: str) -> int:
    """How many YAML documents the file holds (the service's parser says what is wrong with one it cannot read)."""
    from broker.spec.job import SpecError
    from broker.spec.yaml_lines import load_yaml_documents

    try:
        return len(load_yaml_documents(text, source))
    except SpecError:
        return 1


def _launch_pipeline(settings: Served, text: str, job_file: Path, detach: bool, as_json: bool) -> None:
    """Submit every stage in one request (``POST /v1/pipelines``) and follow them, as the embedded launch does."""
    from broker.cli.job_output import announce_pipeline, finish_pipeline

    with connect(settings) as client:
        submitted = client.submit_pipeline(text, str(job_file.resolve()))
        job_ids = submitted["job_ids"]
        announce_pipeline(submitted["name"], submitted["kind"], job_ids,
                          [(stage["name"], stage["num_nodes"]) for stage in submitted["stages"]], detach, as_json)
        if detach:
            return
        _follow(settings, client, job_ids, as_json)
        summaries = [_settled(client, client.job(job_id)) for job_id in job_ids]
    finish_pipeline(submitted["name"], summaries, as_json)


def _follow(settings: Served, client: BrokerClient, job_ids: list[str], as_json: bool) -> None:
    """Poll until every job has ended, showing the first one still going (the embedded launch's table)."""
    from rich.live import Live

    from broker.cli.app import console

    progress = {job_id: _Progress() for job_id in job_ids}
    with Live(console=console, refresh_per_second=4, transient=False, auto_refresh=False) as live:
        while True:
            summaries = [client.job(job_id) for job_id in job_ids]
            going = [summary for summary in summaries if summary["state"] not in _TERMINAL]
            if not as_json:
                shown = (going or summaries)[0]
                progress[shown["job_id"]].update(client, shown["job_id"])
                live.update(progress_table(shown, progress[shown["job_id"]].line), refresh=True)
            if not going:
                return
            time.sleep(settings.poll_seconds)


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


def summaries(settings: Served, job_id: str | None, state: str | None = None,
              newest: int | None = None) -> list[dict[str, Any]]:
    """One job, or every job (of ``state``; only the ``newest`` that many), oldest first."""
    with connect(settings) as client:
        if job_id is not None:
            return [client.job(job_id)]
        if newest is None:
            return client.jobs(state=state)
        return client.newest_jobs(newest, state=state)[::-1]


def cancel(settings: Served, job_id: str) -> str:
    with connect(settings) as client:
        return str(client.cancel(job_id)["state"])


def logs(settings: Served, job_id: str, follow: bool) -> None:
    from broker.status.joblogs import LogChunk, print_chunks

    offsets: dict[str, int] = {}
    with connect(settings) as client:
        while True:
            answer = client.logs(job_id, offsets)
            chunks = [LogChunk(**raw) for raw in answer["chunks"]]
            print_chunks(chunks, offsets)
            if chunks:
                continue  # more may be waiting past the page the server sent
            if not follow or answer["state"] in _TERMINAL:
                break
            time.sleep(0.5)
