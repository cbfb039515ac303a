"""AWS: EC2 Query API (XML) for spot price history and placement scores, the Price List JSON 1.1 API
for on-demand prices; every other EC2 action is forwarded to a moto server (catalog, offerings, zones).
"""

from __future__ import annotations

import http.client
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

from tests.fakeclouds.server import FakeCloud, Request, Response

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
DEFAULT_CODES = {429: "Throttling", 503: "RequestLimitExceeded", 500: "InternalError"}
MESSAGES = {"Throttling": "Rate exceeded", "RequestLimitExceeded": "Request limit exceeded.",
            "InternalError": "An internal error has occurred"}


def spot_record(instance_type: str, zone: str, zone_id: str, price: float, at: datetime) -> dict[str, Any]:
    return {"InstanceType": instance_type, "AvailabilityZone": zone, "AvailabilityZoneId": zone_id,
            "SpotPrice": f"{price:.6f}", "Timestamp": at, "ProductDescription": "Linux/UNIX"}


def price_list_product(instance_type: str, region: str, usd: float, gpus: int, operating_system: str = "Linux",
                       tenancy: str = "Shared", pre_installed: str = "NA", capacity: str = "Used",
                       family: str = "GPU instance") -> dict[str, Any]:
    """One Price List ``GetProducts`` entry as AWS publishes it (product + OnDemand and Reserved terms);
    ``family`` is its ``instanceFamily`` (GPU instance, General purpose, Compute or Memory optimized)."""
    sku = uuid.uuid5(uuid.NAMESPACE_URL, f"{instance_type}/{region}/{operating_system}/{tenancy}/"
                     f"{pre_installed}/{capacity}").hex[:16].upper()
    return {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": instance_type, "regionCode": region, "operatingSystem": operating_system,
                "tenancy": tenancy, "preInstalledSw": pre_installed, "capacitystatus": capacity,
                "licenseModel": "No License required", "instanceFamily": family, **({"gpu": str(gpus)} if gpus else {}),
                "usagetype": f"BoxUsage:{instance_type}", "operation": "RunInstances",
                "servicecode": "AmazonEC2", "location": region,
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                            "description": f"${usd:.4f} per On Demand {operating_system} {instance_type} Instance Hour",
                            "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                            "pricePerUnit": {"USD": f"{usd:.10f}"},
                        }
                    },
                    "sku": sku, "effectiveDate": "2026-01-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
                    "termAttributes": {},
                }
            },
            "Reserved": {
                f"{sku}.4NA7Y494T4": {
                    "priceDimensions": {
                        f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                            "unit": "Hrs", "pricePerUnit": {"USD": f"{usd * 0.6:.10f}"},
                            "description": "Reserved 1yr", "rateCode": f"{sku}.4NA7Y494T4.6YS6EN2CT7",
                        }
                    },
                    "offerTermCode": "4NA7Y494T4", "sku": sku,
                    "termAttributes": {"LeaseContractLength": "1yr", "PurchaseOption": "No Upfront"},
                }
            },
        },
        "version": "20260101000000",
        "publicationDate": "2026-01-01T00:00:00Z",
    }


def _indexed(query: dict[str, list[str]], prefix: str) -> list[str]:
    pattern = re.compile(rf"^{re.escape(prefix)}\.\d+$")
    return [v[0] for k, v in sorted(query.items()) if pattern.match(k)]


def _form_time(form: dict[str, list[str]], name: str) -> datetime | None:
    value = form.get(name, [""])[0]
    if not value:
        return None
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _credential_region(headers: dict[str, str]) -> str:
    match = re.search(r"Credential=[^/]+/\d+/([^/]+)/", headers.get("authorization", ""))
    return match.group(1) if match else "us-east-1"


class FakeAws(FakeCloud):
    def __init__(self, moto_url: str, spot_history: list[dict[str, Any]] | None = None,
                 placement_scores: list[dict[str, Any]] | None = None,
                 products: list[dict[str, Any]] | None = None, page_size: int = 100) -> None:
        self.moto = urlsplit(moto_url)
        self.spot_history = spot_history or []
        self.placement_scores = placement_scores or []
        self.products = products or []
        self.page_size = page_size

    def route(self, request: Request) -> str:
        target = request.headers.get("x-amz-target")
        if target:
            return target.rsplit(".", 1)[-1]
        form = parse_qs(request.body.decode())
        return form.get("Action", ["?"])[0]

    def answer(self, request: Request, route: str, base_url: str) -> Response:
        if route == "DescribeSpotPriceHistory":
            return self._spot_price_history(request)
        if route == "GetSpotPlacementScores":
            return self._placement_scores(request)
        if route == "GetProducts":
            return self._get_products(request)
        return self._forward_to_moto(request)

    def error(self, route: str, status: int, code: str | None) -> Response:
        code = code or DEFAULT_CODES.get(status, "InternalError")
        if route == "GetProducts":
            body = json.dumps({"__type": code if code != "Throttling" else "ThrottlingException",
                               "Message": "Rate exceeded"})
            return Response(status, body.encode(), "application/x-amz-json-1.1")
        xml = ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
               f"<Code>{code}</Code><Message>{escape(MESSAGES.get(code, code))}</Message></Error></Errors>"
               f"<RequestID>{uuid.uuid4()}</RequestID></Response>")
        return Response(status, xml.encode(), "text/xml;charset=UTF-8")

    # -- EC2 Query API ----------------------------------------------------------------------------

    def _page(self, items: list[Any], form: dict[str, list[str]]) -> tuple[list[Any], str | None]:
        start = int(form.get("NextToken", ["0"])[0] or 0)
        size = min(self.page_size, int(form.get("MaxResults", [str(self.page_size)])[0]))
        end = start + size
        return items[start:end], (str(end) if end < len(items) else None)

    def _spot_price_history(self, request: Request) -> Response:
        form = parse_qs(request.body.decode())
        region = _credential_region(request.headers)
        types = set(_indexed(form, "InstanceType"))
        products = set(_indexed(form, "ProductDescription"))
        matches = [r for r in self.spot_history
                   if r["AvailabilityZone"][:-1] == region
                   and (not types or r["InstanceType"] in types)
                   and (not products or r["ProductDescription"] in products)]
        matches.sort(key=lambda r: r["Timestamp"], reverse=True)
        # As EC2 answers: the changes within [StartTime, EndTime], and the price in force at StartTime.
        start, end = _form_time(form, "StartTime"), _form_time(form, "EndTime")
        if end is not None:
            matches = [r for r in matches if r["Timestamp"] <= end]
        if start is not None:
            in_force: set[tuple[str, str]] = set()
            kept = []
            for r in matches:  # newest first
                key = (r["InstanceType"], r["AvailabilityZone"])
                if r["Timestamp"] >= start:
                    kept.append(r)
                elif key not in in_force:
                    in_force.add(key)
                    kept.append(r)
            matches = kept
        page, token = self._page(matches, form)
        items = "".join(
            "<item>"
            f"<instanceType>{r['InstanceType']}</instanceType>"
            f"<productDescription>{escape(r['ProductDescription'])}</productDescription>"
            f"<spotPrice>{r['SpotPrice']}</spotPrice>"
            f"<timestamp>{r['Timestamp'].strftime('%Y-%m-%dT%H:%M:%S.000Z')}</timestamp>"
            f"<availabilityZone>{r['AvailabilityZone']}</availabilityZone>"
            f"<availabilityZoneId>{r['AvailabilityZoneId']}</availabilityZoneId>"
            "</item>"
            for r in page
        )
        return self._xml("DescribeSpotPriceHistoryResponse",
                         f"<spotPriceHistorySet>{items}</spotPriceHistorySet>", token)

    def _placement_scores(self, request: Request) -> Response:
        form = parse_qs(request.body.decode())
        types = set(_indexed(form, "InstanceType"))
        regions = set(_indexed(form, "RegionName"))
        matches = [s for s in self.placement_scores
                   if s["InstanceType"] in types and (not regions or s["Region"] in regions)]
        page, token = self._page(matches, form)
        items = "".join(
            f"<item><region>{s['Region']}</region><availabilityZoneId>{s['AvailabilityZoneId']}"
            f"</availabilityZoneId><score>{s['Score']}</score></item>"
            for s in page
        )
        return self._xml("GetSpotPlacementScoresResponse",
                         f"<spotPlacementScoreSet>{items}</spotPlacementScoreSet>", token)

    def _xml(self, root: str, inner: str, token: str | None) -> Response:
        next_token = f"<nextToken>{token}</nextToken>" if token else ""
        xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{EC2_NS}">'
               f"<requestId>{uuid.uuid4()}</requestId>{inner}{next_token}</{root}>")
        return Response(200, xml.encode(), "text/xml;charset=UTF-8")

    # -- Price List (JSON 1.1) --------------------------------------------------------------------

    def _get_products(self, request: Request) -> Response:
        body = json.loads(request.body or b"{}")
        filters = [(f["Field"], f["Value"]) for f in body.get("Filters", []) if f.get("Type") == "TERM_MATCH"]
        matches = [p for p in self.products
                   if all(p["product"]["attributes"].get(field) == value for field, value in filters)]
        start = int(body.get("NextToken") or 0)
        end = start + min(self.page_size, int(body.get("MaxResults") or self.page_size))
        answer: dict[str, Any] = {"FormatVersion": body.get("FormatVersion", "aws_v1"),
                                  "PriceList": [json.dumps(p) for p in matches[start:end]]}
        if end < len(matches):
            answer["NextToken"] = str(end)
        return Response(200, json.dumps(answer).encode(), "application/x-amz-json-1.1")

    # -- everything else: moto ------------------------------------------------------------------

    def _forward_to_moto(self, request: Request) -> Response:
        connection = http.client.HTTPConnection(self.moto.hostname or "127.0.0.1", self.moto.port, timeout=60)
        try:
            headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
            connection.request(request.method, request.path, body=request.body, headers=headers)
            answer = connection.getresponse()
            return Response(answer.status, answer.read(), answer.getheader("Content-Type") or "text/xml")
        finally:
            connection.close()
