"""GCP: the Cloud Billing Catalog (SKUs, pageToken/nextPageToken), Compute Engine aggregated lists
of machine types and accelerator types, and Compute Engine v1 ``advice.capacity`` (POST
``/compute/v1/projects/{project}/regions/{region}/advice/capacity``) and ``advice.capacityHistory``
(``.../advice/capacityHistory``), as JSON in the REST API's shapes."""

from __future__ import annotations

import json
import re
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.fakeclouds.server import FakeCloud, Request, Response

STATUS_NAMES = {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def sku(description: str, group: str, usage: str, regions: list[str], usd: float, unit: str = "h") -> dict[str, Any]:
    """One Billing Catalog SKU of Compute Engine, priced per ``unit`` (h, or GiBy.h for memory)."""
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    sku_id = f"{zlib.crc32(repr((description, tuple(regions))).encode()) * 4099 % 0xFFFFFFFFFFFF:012X}"
    sku_id = f"{sku_id[:4]}-{sku_id[4:8]}-{sku_id[8:12]}"
    rate: dict[str, Any] = {"currencyCode": "USD", "nanos": nanos}
    if units:
        rate["units"] = str(units)
    return {
        "name": f"services/6F81-5844-456A/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": group, "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{
            "summary": "",
            "pricingExpression": {
                "usageUnit": unit, "displayQuantity": 1,
                "usageUnitDescription": "gibibyte hour" if unit == "GiBy.h" else "hour",
                "baseUnit": "By.s" if unit == "GiBy.h" else "s",
                "baseUnitDescription": "byte second" if unit == "GiBy.h" else "second",
                "baseUnitConversionFactor": 3865470566400 if unit == "GiBy.h" else 3600,
                "tieredRates": [{"startUsageAmount": 0, "unitPrice": rate}],
            },
            "currencyConversionRate": 1,
            "effectiveTime": "2026-01-01T00:00:00.000Z",
        }],
        "serviceProviderName": "Google",
    }


def machine_type(name: str, zone: str, vcpus: int, memory_mb: int, accelerator: str | None = None,
                 gpus: int = 0) -> dict[str, Any]:
    record: dict[str, Any] = {
        "kind": "compute#machineType", "id": str(zlib.crc32(repr((name, zone)).encode()) % 10**15), "name": name,
        "creationTimestamp": "2023-05-10T09:00:00.000-07:00",
        "description": f"{vcpus} vCPUs, {memory_mb // 1024} GB RAM", "guestCpus": vcpus, "memoryMb": memory_mb,
        "imageSpaceGb": 0, "maximumPersistentDisks": 128, "maximumPersistentDisksSizeGb": "263168",
        "zone": zone, "isSharedCpu": False,
        "selfLink": f"https://www.googleapis.com/compute/v1/projects/p/zones/{zone}/machineTypes/{name}",
    }
    if accelerator:
        record["accelerators"] = [{"guestAcceleratorType": accelerator, "guestAcceleratorCount": gpus}]
    return record


def accelerator_type(name: str, zone: str, max_cards: int) -> dict[str, Any]:
    return {
        "kind": "compute#acceleratorType", "id": str(zlib.crc32(repr((name, zone)).encode()) % 10**15), "name": name,
        "creationTimestamp": "1969-12-31T16:00:00.000-08:00", "description": name.upper(),
        "zone": f"https://www.googleapis.com/compute/v1/projects/p/zones/{zone}",
        "selfLink": f"https://www.googleapis.com/compute/v1/projects/p/zones/{zone}/acceleratorTypes/{name}",
        "maximumCardsPerInstance": max_cards,
    }


class FakeGcp(FakeCloud):
    def __init__(self, skus: list[dict[str, Any]], machine_types: list[dict[str, Any]],
                 accelerator_types: list[dict[str, Any]], page_size: int = 5000,
                 advice: dict[tuple[str, str], tuple[float, str]] | None = None,
                 history: dict[tuple[str, str], list[tuple[str, float, float]]] | None = None) -> None:
        # (region or zone, machine type) -> [(day "2026-02-27", preemption rate, spot USD per hour)]
        # that advice.capacityHistory answers with for that location, oldest first
        self.history = history or {}
        self.history_body: bytes | None = None  # set: every advice.capacityHistory call answers exactly this
        self.history_requests: list[dict[str, Any]] = []
        self.skus = skus
        # (zone, machine type) -> (obtainability, estimatedUptime) that advice.capacity answers with
        self.advice = advice or {}
        self.advice_body: bytes | None = None  # set: every advice.capacity call answers exactly this
        self.advice_requests: list[dict[str, Any]] = []
        self.machine_types = machine_types
        self.accelerator_types = accelerator_types
        self.page_size = page_size
        self.api_keys_seen: list[str] = []

    def route(self, request: Request) -> str:
        if request.method == "POST" and re.fullmatch(r"/compute/v1/projects/[^/]+/regions/[^/]+/advice/capacity",
                                                     request.path):
            return "adviceCapacity"
        if request.method == "POST" and re.fullmatch(
                r"/compute/v1/projects/[^/]+/regions/[^/]+/advice/capacityHistory", request.path):
            return "adviceCapacityHistory"
        if request.path.endswith("/skus"):
            return "skus"
        if request.path.endswith("/aggregated/machineTypes"):
            return "machineTypes"
        if request.path.endswith("/aggregated/acceleratorTypes"):
            return "acceleratorTypes"
        return "?"

    def answer(self, request: Request, route: str, base_url: str) -> Response:
        if route == "adviceCapacity":
            return self._advice(request)
        if route == "adviceCapacityHistory":
            return self._history(request)
        if route == "skus":
            if request.param("key"):
                self.api_keys_seen.append(request.param("key"))
            start = int(request.param("pageToken") or 0)
            end = start + min(self.page_size, int(request.param("pageSize") or 5000))
            body = {"skus": self.skus[start:end], "nextPageToken": str(end) if end < len(self.skus) else ""}
            return Response(200, json.dumps(body).encode())
        if route in ("machineTypes", "acceleratorTypes"):
            records = self.machine_types if route == "machineTypes" else self.accelerator_types
            return Response(200, json.dumps(self._aggregated(request, route, records)).encode())
        return Response(404, json.dumps({"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}})
                        .encode())

    def _advice(self, request: Request) -> Response:
        """Best first, one recommendation per requested zone with capacity, as ``ANY_SINGLE_ZONE`` asks."""
        body = json.loads(request.body)
        self.advice_requests.append(body)
        if self.advice_body is not None:
            return Response(200, self.advice_body)
        if body.get("instanceProperties", {}).get("scheduling", {}).get("provisioningModel") != "SPOT":
            return self.error("adviceCapacity", 400, "Invalid value for field 'provisioningModel'")
        machines = [m for selection in body["instanceFlexibilityPolicy"]["instanceSelections"].values()
                    for m in selection["machineTypes"]]
        zones = [z["zone"].rsplit("/", 1)[-1] for z in body["distributionPolicy"]["zones"]]
        offers = [(self.advice[(zone, machine)], zone, machine) for zone in zones for machine in machines
                  if (zone, machine) in self.advice]
        recommendations = [
            {"scores": {"obtainability": obtainability, "estimatedUptime": uptime},
             "shards": [{"zone": zone, "machineType": machine, "instanceCount": body["size"],
                         "provisioningModel": "SPOT"}]}
            for (obtainability, uptime), zone, machine in sorted(offers, key=lambda o: -o[0][0])]
        return Response(200, json.dumps({"recommendations": recommendations}).encode())

    def _history(self, request: Request) -> Response:
        """``CapacityHistoryResponse``: daily intervals, ``listPrice`` as a ``Money``, as the REST API gives them."""
        body = json.loads(request.body)
        self.history_requests.append(body)
        if self.history_body is not None:
            return Response(200, self.history_body)
        properties = body.get("instanceProperties", {})
        if properties.get("scheduling", {}).get("provisioningModel") != "SPOT":
            return self.error("adviceCapacityHistory", 400, "Invalid value for field 'provisioningModel'")
        # the location asked (a zone), else the path's region
        region = request.path.split("/regions/", 1)[1].split("/", 1)[0]
        location = str(body.get("locationPolicy", {}).get("location", "")).rsplit("/", 1)[-1] or region
        machine = properties.get("machineType")
        days = self.history.get((location, machine), [])
        types = set(body.get("types") or ["PREEMPTION", "PRICE"])

        def interval(day: str) -> dict[str, str]:
            start = datetime.fromisoformat(day).replace(tzinfo=UTC) + timedelta(hours=8)  # midnight Pacific
            return {"startTime": start.isoformat().replace("+00:00", "Z"),
                    "endTime": (start + timedelta(days=1)).isoformat().replace("+00:00", "Z")}

        kind = "regions" if location == region else "zones"
        answer: dict[str, Any] = {"machineType": machine,
                                  "location": f"https://www.googleapis.com/compute/v1/projects/p/{kind}/{location}"}
        if "PREEMPTION" in types:
            answer["preemptionHistory"] = [{"interval": interval(d), "preemptionRate": rate} for d, rate, _ in days]
        if "PRICE" in types:
            answer["priceHistory"] = [{"interval": interval(d), "listPrice": {
                "currencyCode": "USD", "units": str(int(usd)), "nanos": round((usd - int(usd)) * 1e9)}}
                for d, _, usd in days]
        return Response(200, json.dumps(answer).encode())

    def _aggregated(self, request: Request, key: str, records: list[dict[str, Any]]) -> dict[str, Any]:
        wanted = _name_regex(request.param("filter"))
        matches = [r for r in records if wanted is None or wanted.fullmatch(r["name"])]
        start = int(request.param("pageToken") or 0)
        end = start + min(self.page_size, int(request.param("maxResults") or 500))
        items: dict[str, Any] = {}
        for record in matches[start:end]:
            zone = record["zone"].rsplit("/", 1)[-1]
            items.setdefault(f"zones/{zone}", {key: []})[key].append(record)
        body: dict[str, Any] = {"kind": f"compute#{key[:-1]}AggregatedList", "id": f"projects/p/aggregated/{key}",
                                "items": items, "selfLink": f"https://www.googleapis.com/compute/v1/projects/p/"
                                f"aggregated/{key}"}
        if end < len(matches):
            body["nextPageToken"] = str(end)
        return body

    def error(self, route: str, status: int, code: str | None) -> Response:
        reason = "rateLimitExceeded" if status == 429 else "backendError"
        body = {"error": {"code": status, "message": code or f"{reason} (fake)",
                          "status": STATUS_NAMES.get(status, "UNKNOWN"),
                          "errors": [{"message": reason, "domain": "global", "reason": reason}]}}
        return Response(status, json.dumps(body).encode())


def _name_regex(expression: str) -> re.Pattern[str] | None:
    match = re.fullmatch(r'\s*name\s+eq\s+"(.*)"\s*', expression or "")
    return re.compile(match.group(1)) if match else None
