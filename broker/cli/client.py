"""A small client of the service's /v1 API, for the CLI's ``--server`` mode."""

from __future__ import annotations

import http.client
import json
import time
import uuid
from typing import Any
from urllib.parse import urlencode, urlsplit

from broker.errors import BrokerError

MAX_ANSWER_BYTES = 64 * 2**20  # a page of jobs or logs; more is not an answer from the broker
# A submission carries an Idempotency-Key, so it is safe to send again when no answer came.
SUBMIT_TRIES = 3


class ClientError(BrokerError):
    """The service refused a request, or could not be reached; ``str()`` is the one-line reason."""


class BrokerClient:
    """Plain ``http.client`` (not httpx, whose import pulls in its own command line: Rich, Pygments),
    so that `broker status --server` starts in a fraction of a second."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018  (raises ValueError for a port out of range)
        except ValueError:
            parts = urlsplit("")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(f"--server: expected a URL like http://127.0.0.1:8470, got {url[:200]!r}")
        self._parts, self._timeout = parts, timeout
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._parts.scheme == "https" else http.client.HTTPConnection
            self._conn = kind(self._parts.hostname or "", self._parts.port, timeout=self._timeout)
        return self._conn

    def _call(self, method: str, path: str, json_body: Any = None,
              params: dict[str, list[str]] | None = None, idempotency_key: str | None = None) -> Any:
        """One request; with ``idempotency_key`` it is sent again (same key) when no answer came."""
        target = self._parts.path.rstrip("/") + path + (f"?{urlencode(params, doseq=True)}" if params else "")
        body = json.dumps(json_body).encode() if json_body is not None else None
        headers = {**self._headers, **({"Content-Type": "application/json"} if body is not None else {}),
                   **({"Idempotency-Key": idempotency_key} if idempotency_key else {})}
        tries = SUBMIT_TRIES if idempotency_key else 2
        for attempt in range(1, tries + 1):
            reused = self._conn is not None
            try:
                conn = self._connection()
                conn.request(method, target, body=body, headers=headers)
                response = conn.getresponse()
                status, text = response.status, response.read(MAX_ANSWER_BYTES + 1)
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                # A kept-alive connection the server closed meanwhile is opened once more; a keyed
                # submission is sent again on any failure, as the broker stores it once whatever happens.
                stale = reused and attempt == 1 and isinstance(exc, (ConnectionError, http.client.RemoteDisconnected))
                if attempt == tries or not (stale or idempotency_key):
                    raise ClientError(f"cannot reach the broker at {self.url}: {exc}") from None
                if not stale:
                    time.sleep(0.5 * attempt)
        if len(text) > MAX_ANSWER_BYTES:
            raise ClientError(f"the broker at {self.url} answered more than {MAX_ANSWER_BYTES // 2**20} MB")
        if status < 400:
            try:
                return json.loads(text)
            except ValueError:
                raise ClientError(f"the broker at {self.url} answered {status} with no JSON: "
                                  f"{text[:200].decode(errors='replace')}") from None
        raise ClientError(_reason(status, text))

    def submit(self, text: str, source: str | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json_body={"spec": text, "source": source},  # type: ignore[no-any-return]
                          idempotency_key=str(uuid.uuid4()))

    def submit_pipeline(self, text: str, source: str | None = None) -> dict[str, Any]:
        """A multi-document job file: its stages recorded together (``POST /v1/pipelines``)."""
        return self._call("POST", "/v1/pipelines", json_body={"spec": text,  # type: ignore[no-any-return]
                                                             "source": source}, idempotency_key=str(uuid.uuid4()))

    def newest_jobs(self, count: int, state: str | None = None, page: int = 500) -> list[dict[str, Any]]:
        """The newest ``count`` jobs of the caller's team (of ``state``), newest first, a page at a time."""
        found: list[dict[str, Any]] = []
        params: dict[str, list[str]] = {"order": ["desc"], **({"state": [state]} if state else {})}
        while len(found) < count:
            params["limit"] = [str(min(page, count - len(found)))]
            batch = self._call("GET", "/v1/jobs", params=params)
            found.extend(batch)
            if len(batch) < int(params["limit"][0]):
                break
            params["after"] = [str(batch[-1]["job_id"])]
        return found

    def jobs(self, page: int = 500, state: str | None = None) -> list[dict[str, Any]]:
        """Every job of the caller's team (of ``state``), read a page at a time (``GET /v1/jobs`` is paginated)."""
        found: list[dict[str, Any]] = []
        params: dict[str, list[str]] = {"limit": [str(page)], **({"state": [state]} if state else {})}
        while True:
            batch = self._call("GET", "/v1/jobs", params=params)
            found.extend(batch)
            if len(batch) < page:
                return found
            params["after"] = [str(batch[-1]["job_id"])]

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")  # type: ignore[no-any-return]

    def logs(self, job_id: str, offsets: dict[str, int]) -> dict[str, Any]:
        params = {"offset": [f"{name}:{end}" for name, end in offsets.items()]}
        return self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)  # type: ignore[no-any-return]


def _reason(status: int, text: bytes) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return f"the broker answered {status}: {text[:200].decode(errors='replace')}"
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]  # an invalid job file: the same line the embedded broker prints
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail)
    if status == 401:
        return f"the broker refused the token ({detail}); create one with `broker token create --team TEAM`"
    return str(detail)
