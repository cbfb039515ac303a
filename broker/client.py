"""A small client of the service's /v1 API, for the CLI's ``--server`` mode."""

from __future__ import annotations

from typing import Any

import httpx


class ClientError(Exception):
    """The service refused a request, or could not be reached; ``str()`` is the one-line reason."""


class BrokerClient:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout,
                                  headers={"Authorization": f"Bearer {token}"})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach the broker at {self.url}: {exc}") from None
        if response.status_code < 400:
            return response.json()
        raise ClientError(_reason(response))

    def submit(self, text: str, source: str | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json={"spec": text, "source": source})  # type: ignore[no-any-return]

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/jobs")  # type: ignore[no-any-return]

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")  # type: ignore[no-any-return]

    def logs(self, job_id: str, offsets: dict[str, int]) -> dict[str, Any]:
        params = {"offset": [f"{name}:{end}" for name, end in offsets.items()]}
        return self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)  # type: ignore[no-any-return]


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"the broker answered {response.status_code}: {response.text[:200]}"
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]  # an invalid job file: the same line the embedded broker prints
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail)
    if response.status_code == 401:
        return f"the broker refused the token ({detail}); create one with `broker token create --team TEAM`"
    return str(detail)
