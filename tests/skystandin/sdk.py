"""The SkyPilot SDK calls the broker makes, answered by the stand-in API server (``server.py``).

``broker serve`` loads it through its ``skypilot_sdk`` setting (``tests.skystandin.sdk:sky``);
the server's address is ``$BROKER_SKY_STANDIN_URL``. A test in the server's own process takes
one from ``SkyStandIn.sdk()``, which knows the address. As in SkyPilot 0.14, every call returns a
``RequestId`` at once and ``get`` waits for the result: ``sky.status`` as SkyPilot's own
``StatusResponse`` records, ``sky.queue`` as ``ClusterJobRecord``s, with SkyPilot's
``ClusterStatus`` and ``JobStatus``, and failures raised as the ``sky.exceptions`` class the real
server names. A task travels as its YAML mapping, as the real client sends it; ``Task`` keeps the
mapping rather than building SkyPilot's own ``Task``, which needs SkyPilot's catalog (fetched
from the network) to check its resources.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
from sky import ClusterStatus, JobStatus, StatusRefreshMode, exceptions
from sky.schemas.api.responses import ClusterJobRecord, StatusResponse
from sky.server.common import RequestId


class StandInTask:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    @classmethod
    def from_yaml_config(cls, config: dict[str, Any]) -> StandInTask:
        return cls(config)

    def to_yaml_config(self) -> dict[str, Any]:
        return self.config


class StandInSky:
    Task = StandInTask
    StatusRefreshMode = StatusRefreshMode

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self._url or os.environ["BROKER_SKY_STANDIN_URL"], timeout=60)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _call(self, call: str, **args: Any) -> RequestId[Any]:
        try:
            response = self.client.post("/", json={"call": call, "args": args})
        except httpx.HTTPError as exc:
            raise exceptions.ApiServerConnectionError(str(self.client.base_url)) from exc
        return RequestId(response.json()["request_id"])

    def get(self, request_id: str) -> Any:
        while True:
            try:
                answer = self.client.get("/", params={"request_id": str(request_id), "wait": 10}, timeout=30).json()
            except httpx.HTTPError as exc:
                raise exceptions.ApiServerConnectionError(str(self.client.base_url)) from exc
            if answer["done"]:
                break
        error = answer.get("error")
        if error:
            kind = getattr(exceptions, str(error["type"]), None)
            if isinstance(kind, type) and issubclass(kind, BaseException):
                if kind is exceptions.CommandError:
                    raise kind(1, "setup", str(error["message"]), None)
                raise kind(str(error["message"]))
            raise RuntimeError(str(error["message"]))
        result = answer["result"]
        if answer["call"] == "status":
            return [StatusResponse.model_validate({**r, "status": ClusterStatus(r["status"])}) for r in result]
        if answer["call"] == "queue":
            return [ClusterJobRecord.model_validate({**j, "status": JobStatus(j["status"])}) for j in result]
        return tuple(result) if isinstance(result, list) and answer["call"] in ("launch", "exec") else result

    def launch(self, task: StandInTask, cluster_name: str, idle_minutes_to_autostop: int | None = None,
               down: bool = False, **_: Any) -> RequestId[Any]:
        return self._call("launch", task=task.to_yaml_config(), cluster_name=cluster_name,
                          idle_minutes_to_autostop=idle_minutes_to_autostop, down=down)

    def exec(self, task: StandInTask, cluster_name: str | None = None, **_: Any) -> RequestId[Any]:
        return self._call("exec", task=task.to_yaml_config(), cluster_name=cluster_name)

    def status(self, cluster_names: list[str] | None = None, refresh: Any = None,
               all_users: bool = False) -> RequestId[Any]:
        return self._call("status", cluster_names=cluster_names)

    def queue(self, cluster_name: str, skip_finished: bool = False, all_users: bool = False) -> RequestId[Any]:
        return self._call("queue", cluster_name=cluster_name)

    def cancel(self, cluster_name: str, job_ids: list[int] | None = None, **_: Any) -> RequestId[Any]:
        return self._call("cancel", cluster_name=cluster_name, job_ids=list(job_ids or []))

    def down(self, cluster_name: str, purge: bool = False) -> RequestId[Any]:
        return self._call("down", cluster_name=cluster_name)

    def api_cancel(self, request_ids: str, silent: bool = False) -> RequestId[Any]:
        return self._call("api_cancel", request_ids=str(request_ids))


sky = StandInSky()
