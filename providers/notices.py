"""Node-side preemption-notice readers: what a node's metadata service says about its own fate.

Each reader's ``poll()`` returns the notices present now (empty when none), returns promptly,
and never raises on a bad answer: a garbage response is logged once as a warning and read as
"no notice". ``acknowledge(notice)`` tells the cloud the node is ready to go (Azure's
``StartRequests``); clouds that need no answer ignore it.
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeNotice:
    kind: str  # terminate | stop | hibernate | rebalance | maintenance
    action_time: datetime | None
    raw: dict[str, Any] = field(default_factory=dict)


class NoticeReader(Protocol):
    cloud: str

    def poll(self) -> list[NodeNotice]: ...

    def acknowledge(self, notice: NodeNotice) -> None: ...


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class AwsImdsReader:
    """EC2 instance metadata, IMDSv2: a session token first, then the spot and rebalance paths.

    ``/latest/meta-data/spot/instance-action`` answers 404 until AWS schedules the interruption,
    then ``{"action": "terminate"|"stop"|"hibernate", "time": "2026-...Z"}`` about two minutes ahead.
    """

    cloud = "aws"
    TOKEN_TTL_SECONDS = 21600

    def __init__(self, base_url: str = "http://169.254.169.254", timeout: float = 2.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None
        self._warned: set[str] = set()

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(self.base_url + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read() or b""

    def _fetch_token(self) -> str | None:
        status, body = self._request("PUT", "/latest/api/token",
                                     {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_SECONDS)})
        if status != 200 or not body:
            self._warn("token", f"IMDSv2 token request answered {status}")
            return None
        return body.decode().strip()

    def _get(self, path: str) -> tuple[int, bytes]:
        for _ in range(2):
            if self._token is None:
                self._token = self._fetch_token()
                if self._token is None:
                    return 0, b""
            status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._token})
            if status != 401:
                return status, body
            self._token = None  # expired or rejected: one fresh token, then give up for this poll
        return 401, b""

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def _json(self, path: str) -> dict[str, Any] | None:
        try:
            status, body = self._get(path)
        except (OSError, urllib.error.URLError) as exc:
            self._warn("unreachable", f"instance metadata at {self.base_url} unreachable: {exc}")
            return None
        if status == 404 or status == 0:
            return None
        if status != 200:
            self._warn(f"{path}:{status}", f"{path} answered HTTP {status}; treated as no notice")
            return None
        try:
            data = json.loads(body)
        except ValueError:
            self._warn(f"{path}:json", f"{path} answered something that is not JSON: {body[:80]!r}")
            return None
        if not isinstance(data, dict):
            self._warn(f"{path}:shape", f"{path} answered JSON that is not an object: {body[:80]!r}")
            return None
        return data

    def poll(self) -> list[NodeNotice]:
        notices: list[NodeNotice] = []
        action = self._json("/latest/meta-data/spot/instance-action")
        if action is not None:
            kind = str(action.get("action", "")).lower()
            when = _parse_time(action.get("time"))
            if kind in ("terminate", "stop", "hibernate") and when is not None:
                notices.append(NodeNotice(kind, when, action))
            else:
                self._warn("action-shape", f"spot/instance-action has an unexpected shape: {action}")
        rebalance = self._json("/latest/meta-data/events/recommendations/rebalance")
        if rebalance is not None and "noticeTime" in rebalance:
            notices.append(NodeNotice("rebalance", None, rebalance))
        return notices

    def acknowledge(self, notice: NodeNotice) -> None:
        """EC2 takes the node at the notice's time whatever the node says."""


class _Warnings:
    def __init__(self) -> None:
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def warn(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message)


class _GcpWatch:
    """One metadata value kept current by a thread that hangs on ``wait_for_change``.

    The first read is plain (the value now, and its ETag); every later one waits, server side,
    for the value to move from that ETag, for at most ``wait_seconds``. The agent's loop only
    reads ``value``: it never waits on the metadata server.
    """

    def __init__(self, reader: GcpMetadataReader, path: str) -> None:
        self.reader = reader
        self.path = path
        self.value: str | None = None
        self.etag: str | None = None
        self.thread = threading.Thread(target=self._run, name=f"gcp-watch-{path}", daemon=True)

    def _run(self) -> None:
        reader = self.reader
        while not reader.stopped.is_set():
            query: dict[str, str] = {}
            if self.etag is not None:
                query = {"wait_for_change": "true", "last_etag": self.etag, "timeout_sec": str(reader.wait_seconds)}
            url = f"{reader.base_url}/computeMetadata/v1/instance/{self.path}"
            if query:
                url += "?" + urllib.parse.urlencode(query)
            request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
            timeout = reader.timeout + (reader.wait_seconds if query else 0)
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    body = response.read().decode(errors="replace").strip()
                    self.value = body
                    self.etag = response.headers.get("ETag") or self.etag or ""
                    continue
            except urllib.error.HTTPError as exc:
                reader.warnings.warn(f"{self.path}:{exc.code}", f"GCP metadata {self.path} answered HTTP {exc.code}; "
                                     "treated as no notice")
            except (OSError, urllib.error.URLError) as exc:
                reader.warnings.warn("unreachable", f"GCP metadata at {reader.base_url} unreachable: {exc}")
            reader.stopped.wait(reader.retry_seconds)


class GcpMetadataReader:
    """GCE metadata: ``instance/preempted`` (``TRUE`` about 30 s before a spot VM is taken) and
    ``instance/maintenance-event`` (``TERMINATE_ON_HOST_MAINTENANCE`` about 60 s ahead), both
    watched with ``wait_for_change`` in background threads.
    """

    cloud = "gcp"
    PREEMPT_NOTICE = timedelta(seconds=30)
    MAINTENANCE_NOTICE = timedelta(seconds=60)

    def __init__(self, base_url: str = "http://metadata.google.internal", timeout: float = 2.0,
                 wait_seconds: int = 60, retry_seconds: float = 1.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.wait_seconds = wait_seconds
        self.retry_seconds = retry_seconds
        self.warnings = _Warnings()
        self.stopped = threading.Event()
        self._watches = {path: _GcpWatch(self, path) for path in ("preempted", "maintenance-event")}
        self._first_seen: dict[str, datetime] = {}
        self._started = False

    def poll(self) -> list[NodeNotice]:
        if not self._started:
            self._started = True
            for watch in self._watches.values():
                watch.thread.start()
        notices: list[NodeNotice] = []
        preempted = self._watches["preempted"].value
        if preempted is not None:
            if preempted.upper() == "TRUE":
                notices.append(self._notice("terminate", self.PREEMPT_NOTICE, {"preempted": preempted}))
            elif preempted.upper() != "FALSE":
                self.warnings.warn("preempted:shape", f"instance/preempted answered {preempted[:80]!r}; "
                                   "expected TRUE or FALSE")
        event = self._watches["maintenance-event"].value
        if event is not None:
            if event == "TERMINATE_ON_HOST_MAINTENANCE":
                notices.append(self._notice("maintenance", self.MAINTENANCE_NOTICE, {"maintenance-event": event}))
            elif event not in ("NONE", "MIGRATE_ON_HOST_MAINTENANCE"):  # a live migration keeps the VM
                self.warnings.warn("maintenance:shape", f"instance/maintenance-event answered {event[:80]!r}")
        return notices

    def _notice(self, kind: str, ahead: timedelta, raw: dict[str, Any]) -> NodeNotice:
        seen = self._first_seen.setdefault(kind, datetime.now(UTC))
        return NodeNotice(kind, seen + ahead, raw)

    def acknowledge(self, notice: NodeNotice) -> None:
        """GCE stops the VM when its notice runs out; there is nothing to answer."""

    def close(self) -> None:
        self.stopped.set()


class AzureScheduledEventsReader:
    """Azure Scheduled Events: a ``Preempt`` (spot eviction, at least 30 s ahead) or ``Terminate``
    event naming this VM among its ``Resources``. ``acknowledge`` posts ``StartRequests`` for it,
    which lets the eviction go ahead once the checkpoint is safe instead of at ``NotBefore``.
    """

    cloud = "azure"
    API_VERSION = "2020-07-01"
    KINDS: ClassVar[dict[str, str]] = {"Preempt": "terminate", "Terminate": "terminate"}

    def __init__(self, base_url: str = "http://169.254.169.254", timeout: float = 2.0,
                 vm_name: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.vm_name = vm_name
        self.warnings = _Warnings()

    def _call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Metadata": "true"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base_url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read() or b""
        except (OSError, urllib.error.URLError) as exc:
            self.warnings.warn("unreachable", f"Azure instance metadata at {self.base_url} unreachable: {exc}")
            return 0, b""

    def _name(self) -> str | None:
        if self.vm_name is None:
            status, body = self._call("GET", "/metadata/instance/compute/name?api-version=2021-02-01&format=text")
            if status == 200 and body.strip():
                self.vm_name = body.decode(errors="replace").strip()
        return self.vm_name

    def poll(self) -> list[NodeNotice]:
        name = self._name()
        if name is None:
            return []
        status, body = self._call("GET", f"/metadata/scheduledevents?api-version={self.API_VERSION}")
        if status == 0:
            return []
        if status != 200:
            self.warnings.warn(f"events:{status}", f"scheduledevents answered HTTP {status}; treated as no notice")
            return []
        try:
            document = json.loads(body)
            events = document["Events"]
            if not isinstance(events, list):
                raise TypeError("Events is not a list")
        except (ValueError, KeyError, TypeError):
            self.warnings.warn("events:shape", f"scheduledevents answered something unexpected: {body[:80]!r}")
            return []
        notices: list[NodeNotice] = []
        for event in events:
            if not isinstance(event, dict):
                continue
            kind = self.KINDS.get(str(event.get("EventType")))
            resources = event.get("Resources") or []
            if kind is None or name not in resources or event.get("EventStatus") not in ("Scheduled", "Started"):
                continue
            notices.append(NodeNotice(kind, _parse_http_date(event.get("NotBefore")), event))
        return notices

    def acknowledge(self, notice: NodeNotice) -> None:
        event_id = notice.raw.get("EventId")
        if not event_id:
            return
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        status, _ = self._call("POST", f"/metadata/scheduledevents?api-version={self.API_VERSION}", body)
        if status not in (200, 0):
            self.warnings.warn(f"ack:{status}", f"acknowledging event {event_id} answered HTTP {status}")


def _parse_http_date(text: Any) -> datetime | None:
    """``NotBefore`` is an RFC 1123 date ("Mon, 19 Sep 2016 18:29:47 GMT"), empty once the event started."""
    if not text:
        return None
    try:
        value = email.utils.parsedate_to_datetime(str(text))
    except (TypeError, ValueError):
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def reader_for(cloud: str, metadata_url: str | None) -> NoticeReader:
    """The reader for a cloud; the local cloud speaks the AWS format."""
    if cloud in ("aws", "local"):
        return AwsImdsReader(metadata_url or "http://169.254.169.254")
    if cloud == "gcp":
        return GcpMetadataReader(metadata_url or "http://metadata.google.internal")
    if cloud == "azure":
        return AzureScheduledEventsReader(metadata_url or "http://169.254.169.254")
    raise ValueError(f"no notice reader for cloud {cloud!r}; expected aws, gcp, azure or local")
