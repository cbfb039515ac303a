"""Node-side preemption-notice readers: what a node's metadata service says about its own fate.

Each reader's ``poll()`` returns the notices present now (empty when none) and never raises on a
bad answer: a garbage response is logged once as a warning and read as "no notice".
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeNotice:
    kind: str  # terminate | stop | hibernate | rebalance | maintenance
    action_time: datetime | None
    raw: dict[str, Any] = field(default_factory=dict)


class NoticeReader(Protocol):
    cloud: str

    def poll(self) -> list[NodeNotice]: ...


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


def reader_for(cloud: str, metadata_url: str | None) -> NoticeReader:
    """The reader for a cloud; the local cloud speaks the AWS format."""
    if cloud in ("aws", "local"):
        return AwsImdsReader(metadata_url or "http://169.254.169.254")
    raise ValueError(f"no notice reader for cloud {cloud!r} yet; expected aws or local")
