"""Azure: the Retail Prices API (Items, NextPageLink), Compute resource SKUs (value, nextLink) and the
Spot Placement Score (POST ``/subscriptions/{id}/providers/Microsoft.Compute/locations/{location}/
placementScores/spot/generate``)."""

from __future__ import annotations

import json
import re
import zlib
from typing import Any
from urllib.parse import quote

from tests.fakeclouds.server import FakeCloud, Request, Response

ERROR_CODES = {429: "TooManyRequests", 500: "InternalServerError", 503: "ServiceUnavailable"}


def retail_item(size: str, region: str, price: float, variant: str = "", windows: bool = False,
                kind: str = "Consumption", series: str = "NDasr A100 v4") -> dict[str, Any]:
    """One Retail Prices item; ``variant`` is "" (on-demand), "Spot" or "Low Priority"."""
    short = size.removeprefix("Standard_").replace("_", " ")
    sku_name = f"{short} {variant}".strip()
    item: dict[str, Any] = {
        "currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
        "armRegionName": region, "location": region, "effectiveStartDate": "2025-06-01T00:00:00Z",
        "meterId": f"{zlib.crc32(repr((size, region, variant, windows, kind)).encode()) % 10**12:012d}",
        "meterName": sku_name, "productId": "DZH318Z0BQPS", "skuId": "DZH318Z0BQPS/00TG",
        "productName": f"Virtual Machines {series} Series" + (" Windows" if windows else ""),
        "skuName": sku_name, "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8",
        "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": kind, "isPrimaryMeterRegion": True,
        "armSkuName": size,
    }
    if kind == "Reservation":
        item["reservationTerm"] = "1 Year"
        item["unitOfMeasure"] = "1 Hour"
    return item


def resource_sku(size: str, region: str, gpus: int, zones: list[str],
                 restricted_zones: list[str] | None = None, location_restricted: bool = False) -> dict[str, Any]:
    restrictions: list[dict[str, Any]] = []
    if restricted_zones:
        restrictions.append({"type": "Zone", "values": [region], "reasonCode": "NotAvailableForSubscription",
                             "restrictionInfo": {"locations": [region], "zones": restricted_zones}})
    if location_restricted:
        restrictions.append({"type": "Location", "values": [region], "reasonCode": "NotAvailableForSubscription",
                             "restrictionInfo": {"locations": [region]}})
    return {
        "resourceType": "virtualMachines", "name": size, "tier": "Standard",
        "size": size.removeprefix("Standard_"), "family": "standardNDASv4_A100Family",
        "locations": [region], "locationInfo": [{"location": region, "zones": zones, "zoneDetails": []}],
        "capabilities": [{"name": "GPUs", "value": str(gpus)}, {"name": "vCPUs", "value": "96"}],
        "restrictions": restrictions,
    }


class FakeAzure(FakeCloud):
    def __init__(self, items: list[dict[str, Any]], skus: list[dict[str, Any]] | None = None,
                 page_size: int = 100, placement: dict[tuple[str, str, str], str] | None = None) -> None:
        self.items = items
        # (region, zone number, size) -> the score the placement API answers ("High", ...)
        self.placement = placement or {}
        self.placement_body: bytes | None = None  # set: every placement call answers exactly this
        self.placement_requests: list[tuple[str, dict[str, Any]]] = []  # (api-version, body)
        self.skus = skus or []
        self.page_size = page_size
        self.authorizations: list[str] = []

    def route(self, request: Request) -> str:
        if request.method == "POST" and re.fullmatch(
                r"/subscriptions/[^/]+/providers/Microsoft\.Compute/locations/[^/]+/placementScores/spot/generate",
                request.path):
            return "spotPlacementScores"
        if request.path.endswith("/api/retail/prices"):
            return "retail"
        if request.path.endswith("/providers/Microsoft.Compute/skus"):
            return "resourceSkus"
        return "?"

    def answer(self, request: Request, route: str, base_url: str) -> Response:
        if route == "retail":
            return self._retail(request, base_url)
        if route == "spotPlacementScores":
            return self._placement(request)
        if route == "resourceSkus":
            self.authorizations.append(request.headers.get("authorization", ""))
            location = re.search(r"location eq '([^']+)'", request.param("$filter"))
            value = [s for s in self.skus if location is None or location.group(1) in s["locations"]]
            return Response(200, json.dumps({"value": value}).encode())
        return self.error(route, 404, "NotFound")

    def _placement(self, request: Request) -> Response:
        body = json.loads(request.body)
        self.placement_requests.append((request.param("api-version"), body))
        self.authorizations.append(request.headers.get("authorization", ""))
        if self.placement_body is not None:
            return Response(200, self.placement_body)
        if len(body["desiredLocations"]) > 8 or len(body["desiredSizes"]) > 5:
            return self.error("spotPlacementScores", 400, "InvalidParameter")
        scores = []
        for region in body["desiredLocations"]:
            for size in (s["sku"] for s in body["desiredSizes"]):
                zonal = [(z, level) for (r, z, s), level in sorted(self.placement.items()) if (r, s) == (region, size)]
                for zone, level in zonal or [("", "DataNotFoundOrStale")]:
                    entry = {"sku": size, "region": region, "score": level, "isQuotaAvailable": True}
                    if body.get("availabilityZones") and zone:
                        entry["availabilityZone"] = zone
                    scores.append(entry)
        answer = {**body, "placementScores": scores}
        return Response(200, json.dumps(answer).encode())

    def _retail(self, request: Request, base_url: str) -> Response:
        expression = request.param("$filter")
        region = re.search(r"armRegionName eq '([^']+)'", expression)
        sizes = set(re.findall(r"armSkuName eq '([^']+)'", expression))
        matches = [i for i in self.items
                   if (region is None or i["armRegionName"] == region.group(1))
                   and (not sizes or i["armSkuName"] in sizes)]
        skip = int(request.param("$skip") or 0)
        end = skip + self.page_size
        next_link = None
        if end < len(matches):
            next_link = f"{base_url}/api/retail/prices?$filter={quote(expression)}&$skip={end}"
        body = {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                "Items": matches[skip:end], "NextPageLink": next_link, "Count": len(matches[skip:end])}
        return Response(200, json.dumps(body).encode())

    def error(self, route: str, status: int, code: str | None) -> Response:
        body = {"error": {"code": code or ERROR_CODES.get(status, "Error"), "message": "try again later (fake)"}}
        return Response(status, json.dumps(body).encode())
