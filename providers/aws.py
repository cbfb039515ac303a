"""AWS: the GPU catalog, spot and on-demand prices of GPU and the catalog's CPU-only types, and spot
placement scores of GPU types (and, below, room for the node-side preemption-notice reader).

Sources: EC2 ``DescribeInstanceTypes`` (``GpuInfo``) and ``DescribeInstanceTypeOfferings`` (which
zones sell a type), ``DescribeSpotPriceHistory`` (Linux/UNIX, the price in force now per zone),
``GetSpotPlacementScores`` (1-10 per zone) and the Price List ``GetProducts`` (on-demand, Linux,
shared tenancy). ``history`` reads ``DescribeSpotPriceHistory`` back over days for the price book's
backfill. Endpoints follow boto3's own ``AWS_ENDPOINT_URL_EC2``/``AWS_ENDPOINT_URL_PRICING``
or are passed in. boto3 is imported only inside functions.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from providers import catalog
from providers.base import CloudUnavailable, SpotQuote
from providers.fetching import Backoff, Progress, fan_out, with_retries
from providers.node_notice import NodeNotice, OnceWarnings, parse_iso_time

# ---------------------------------------------------------------------------------------------
# Prices and catalog
# ---------------------------------------------------------------------------------------------

DEFAULT_REGIONS: tuple[str, ...] = (
    "us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1",
)
# Instance families that carry NVIDIA GPUs; types found there without GpuInfo are completed from
# the built-in catalog.
GPU_FAMILIES: tuple[str, ...] = ("p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "g4dn", "g5", "g6", "g6e")
# The CPU-only types quoted are the built-in catalog's (its families: c5, c6i, c7i, m5, m6i, m7i, r5,
# r6i, t3); the Price List files them under these instance families, one GetProducts listing each.
CPU_TYPES: frozenset[str] = frozenset(t.name for t in catalog.cpu_instance_types("aws"))
CPU_FAMILIES: tuple[str, ...] = tuple(sorted({name.split(".")[0] for name in CPU_TYPES}))
PRICE_LIST_FAMILIES = {"c": "Compute optimized", "m": "General purpose", "t": "General purpose",
                       "r": "Memory optimized"}
THROTTLING_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException",
    "RequestThrottled", "RequestThrottledException", "InternalError", "InternalFailure",
    "ServiceUnavailable", "Unavailable",
})
PRICING_REGION = "us-east-1"  # the Price List API answers only from a few regions
MAX_SPOT_PRICE = 10_000.0  # USD per instance-hour: more is not a spot price
MAX_HISTORY_RECORDS = 200_000  # price changes one backfill keeps (weeks of every GPU type in a region)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AwsGpuType:
    name: str
    accelerator: str
    gpus: int
    gpu_memory_gb: float | None


def gpu_types(instance_types: Iterable[dict[str, Any]]) -> dict[str, AwsGpuType]:
    """GPU instance types from ``DescribeInstanceTypes`` records; the catalog fills missing GpuInfo."""
    found: dict[str, AwsGpuType] = {}
    for record in instance_types:
        name = record.get("InstanceType", "")
        known = catalog.find("aws", name)
        gpus = (record.get("GpuInfo") or {}).get("Gpus") or []
        if known is not None:
            found[name] = AwsGpuType(name, known.accelerator, known.gpus, known.gpu_memory_gb)
        elif gpus:
            gpu = gpus[0]
            memory_mib = (gpu.get("MemoryInfo") or {}).get("SizeInMiB")
            found[name] = AwsGpuType(name, str(gpu.get("Name", "?")), int(gpu.get("Count", 0)),
                                     round(memory_mib / 1024, 1) if memory_mib else None)
    return {k: v for k, v in found.items() if v.gpus > 0}


def cpu_types(instance_types: Iterable[dict[str, Any]]) -> dict[str, AwsGpuType]:
    """The catalog's CPU-only types among ``DescribeInstanceTypes`` records (no GPU: accelerator "", 0)."""
    return {name: AwsGpuType(name, "", 0, None) for record in instance_types
            if (name := record.get("InstanceType", "")) in CPU_TYPES and not (record.get("GpuInfo") or {}).get("Gpus")}


def price_list_family(instance_type: str) -> str:
    """The Price List's ``instanceFamily`` of a type the poller quotes."""
    if instance_type in CPU_TYPES:
        return PRICE_LIST_FAMILIES[instance_type[0]]
    return "GPU instance"


def latest_spot_prices(history: Iterable[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """The newest ``SpotPrice`` per (instance type, availability zone)."""
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for item in history:
        key = (item["InstanceType"], item["AvailabilityZone"])
        stamp = item["Timestamp"]
        if key not in newest or stamp > newest[key][0]:
            newest[key] = (stamp, float(item["SpotPrice"]))
    return {key: price for key, (_, price) in newest.items()}


def on_demand_prices(price_list: Iterable[str | dict[str, Any]]) -> dict[str, float]:
    """Hourly Linux on-demand price per instance type from Price List ``GetProducts`` entries."""
    prices: dict[str, float] = {}
    for entry in price_list:
        product = json.loads(entry) if isinstance(entry, str) else entry
        attributes = product.get("product", {}).get("attributes", {})
        if (attributes.get("operatingSystem") != "Linux" or attributes.get("tenancy") != "Shared"
                or attributes.get("preInstalledSw", "NA") != "NA"
                or attributes.get("capacitystatus", "Used") != "Used"):
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if dimension.get("unit") == "Hrs" and usd is not None and float(usd) > 0:
                    prices[attributes["instanceType"]] = float(usd)
    return prices


def scores_by_zone(scores: Iterable[dict[str, Any]], zone_names: dict[str, str]) -> dict[str, float]:
    """Placement scores keyed by zone name (the API answers with zone ids, which differ per account)."""
    return {zone_names[s["AvailabilityZoneId"]]: float(s["Score"])
            for s in scores if s.get("AvailabilityZoneId") in zone_names}


@dataclass
class RegionFacts:
    region: str
    types: dict[str, AwsGpuType]
    zones_of: dict[str, list[str]]
    spot: dict[tuple[str, str], float]
    on_demand: dict[str, float]
    zone_names: dict[str, str]
    scores: dict[tuple[str, str], float] = field(default_factory=dict)


def region_quotes(facts: RegionFacts, observed_at: datetime) -> list[SpotQuote]:
    quotes = []
    for name, gpu in sorted(facts.types.items()):
        for zone in sorted(facts.zones_of.get(name, [])):
            spot = facts.spot.get((name, zone))
            on_demand = facts.on_demand.get(name)
            if spot is None and on_demand is None:
                continue
            quotes.append(SpotQuote(
                cloud="aws", region=facts.region, zone=zone, instance_type=name,
                accelerator=gpu.accelerator, gpus_per_node=gpu.gpus, gpu_memory_gb=gpu.gpu_memory_gb,
                spot_price=spot, on_demand_price=on_demand, observed_at=observed_at,
                capacity_score=facts.scores.get((name, zone)),
            ))
    return quotes


def _spot_price(text: object) -> float | None:
    """A ``SpotPrice`` (a decimal string) as a finite USD figure in (0, MAX_SPOT_PRICE]; None otherwise."""
    if not isinstance(text, str) or len(text) > 32:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 < value <= MAX_SPOT_PRICE else None


def aws_retryable(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return exc.response.get("Error", {}).get("Code") in THROTTLING_CODES or status == 429 or status >= 500
    return isinstance(exc, (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError))


class AwsPriceSource:
    """Polls every GPU offer in the given regions; implements ``providers.base.PriceSource``."""

    cloud = "aws"
    backfill_days = 0.0  # days of ``history`` a process's first poll stores (broker.market.backfill)

    def __init__(self, regions: Iterable[str] = DEFAULT_REGIONS, ec2_endpoint: str | None = None,
                 pricing_endpoint: str | None = None, backoff: Backoff | None = None,
                 placement_scores: bool = True, max_workers: int = 16, cpu_types: bool = True) -> None:
        self.regions = list(regions)
        self.cpu_types = cpu_types  # False: GPU types only (the catalog's CPU-only types are left out)
        self.ec2_endpoint = ec2_endpoint
        self.pricing_endpoint = pricing_endpoint
        self.backoff = backoff or Backoff()
        self.placement_scores = placement_scores
        self.max_workers = max_workers
        self.notes: list[str] = []
        self.last_quotes: list[SpotQuote] = []
        self._session: Any = None
        self._client_lock = threading.Lock()

    def fetch_quotes(self, regions: list[str] | None = None, progress: Progress | None = None) -> list[SpotQuote]:
        self.notes = []
        self._session = self._new_session()
        wanted = regions or self.regions
        observed_at = datetime.now(UTC)
        total = len(wanted) + 1
        done = 0

        def region_done(_: int, __: int) -> None:
            nonlocal done
            done += 1
            if progress:
                progress(done, total)

        facts = fan_out(self._region_facts, wanted, self.max_workers, region_done)
        if self.placement_scores:
            self._add_placement_scores(facts)
        if progress:
            progress(total, total)
        self.last_quotes = [q for f in facts for q in region_quotes(f, observed_at)]
        return self.last_quotes

    # -- the price history, for the backfill -------------------------------------------------------

    def history(self, since: datetime) -> list[SpotQuote]:
        """Every spot price change since ``since`` of the GPU offers the last poll quoted, as past
        quotes (the price in force at ``since`` first, at ``since``); on-demand price, GPUs and
        the rest are the current quote's. A region whose history cannot be read, and each record
        that is not a usable price, is left out with a note."""
        from botocore.exceptions import BotoCoreError, ClientError

        current = {(q.instance_type, q.zone): q for q in self.last_quotes
                   if q.gpus_per_node and q.spot_price is not None}
        regions = sorted({q.region for q in current.values()})
        found: list[SpotQuote] = []
        now = datetime.now(UTC)
        for region in regions:
            names = sorted({name for (name, _), q in current.items() if q.region == region})
            try:
                records = self._pages(self._client("ec2", region).describe_spot_price_history, "SpotPriceHistory",
                                      InstanceTypes=names, ProductDescriptions=["Linux/UNIX"], StartTime=since,
                                      EndTime=now, MaxResults=1000, limit=MAX_HISTORY_RECORDS)
            except (ClientError, BotoCoreError) as exc:
                self.notes.append(f"aws: spot price history {region} unavailable ({type(exc).__name__})")
                continue
            refused = 0
            for record in records[:MAX_HISTORY_RECORDS]:
                quote = current.get((record.get("InstanceType"), record.get("AvailabilityZone")))
                price, stamp = _spot_price(record.get("SpotPrice")), record.get("Timestamp")
                if quote is None or price is None or not isinstance(stamp, datetime):
                    refused += 1
                    continue
                stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
                found.append(replace(quote, spot_price=price, observed_at=max(stamp, since), capacity_score=None))
            if refused:
                self.notes.append(f"aws: spot price history {region}: {refused} record(s) without a usable "
                                  f"SpotPrice (0-{MAX_SPOT_PRICE:g}), Timestamp or known offer; left out")
            if len(records) > MAX_HISTORY_RECORDS:
                self.notes.append(f"aws: spot price history {region}: {len(records)} records; "
                                  f"the first {MAX_HISTORY_RECORDS} kept")
        return sorted(found, key=lambda q: q.observed_at)

    # -- one region --------------------------------------------------------------------------

    def _region_facts(self, region: str) -> RegionFacts:
        ec2 = self._client("ec2", region)
        families = (*GPU_FAMILIES, *CPU_FAMILIES) if self.cpu_types else GPU_FAMILIES
        records = self._pages(ec2.describe_instance_types, "InstanceTypes", Filters=[
            {"Name": "instance-type", "Values": [f"{family}.*" for family in families]}])
        types = {**gpu_types(records), **(cpu_types(records) if self.cpu_types else {})}
        if not types:
            return RegionFacts(region, {}, {}, {}, {}, {})
        names = sorted(types)
        zones_of: dict[str, list[str]] = {}
        for offering in self._pages(ec2.describe_instance_type_offerings, "InstanceTypeOfferings",
                                    LocationType="availability-zone",
                                    Filters=[{"Name": "instance-type", "Values": names}]):
            zones_of.setdefault(offering["InstanceType"], []).append(offering["Location"])
        zone_names = {z["ZoneId"]: z["ZoneName"] for z in self._call(ec2.describe_availability_zones)
                      .get("AvailabilityZones", []) if "ZoneId" in z}
        history = self._pages(ec2.describe_spot_price_history, "SpotPriceHistory", InstanceTypes=names,
                              ProductDescriptions=["Linux/UNIX"], StartTime=datetime.now(UTC), MaxResults=1000)
        return RegionFacts(region, types, zones_of, latest_spot_prices(history),
                           self._on_demand(region, names), zone_names)

    def _on_demand(self, region: str, names: list[str]) -> dict[str, float]:
        """One Price List listing per instance family the types fall in (GPU instance, and the CPU families')."""
        pricing = self._client("pricing", PRICING_REGION)
        entries: list[Any] = []
        for family in sorted({price_list_family(name) for name in names}):
            filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
                ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
                ("preInstalledSw", "NA"), ("capacitystatus", "Used"), ("instanceFamily", family))]
            entries += self._pages(pricing.get_products, "PriceList", ServiceCode="AmazonEC2", Filters=filters,
                                   FormatVersion="aws_v1", MaxResults=100)
        wanted = set(names)
        return {k: v for k, v in on_demand_prices(entries).items() if k in wanted}

    # -- placement scores: one request per instance type across all regions -------------------

    def _add_placement_scores(self, facts: list[RegionFacts]) -> None:
        from botocore.exceptions import ClientError

        # Only GPU types with a spot market somewhere are worth a score (and a request: one per type).
        # CPU-only types get none: their spot pools are deep, and a request each would double the poll.
        regions_of: dict[str, list[str]] = {}
        for f in facts:
            priced = {name for name, _ in f.spot}
            for name, kind in f.types.items():
                if kind.gpus and f.zones_of.get(name) and name in priced:
                    regions_of.setdefault(name, []).append(f.region)
        if not regions_of:
            return
        by_region = {f.region: f for f in facts}
        ec2 = self._client("ec2", facts[0].region)

        def scores_for(name: str) -> list[dict[str, Any]]:
            return self._pages(ec2.get_spot_placement_scores, "SpotPlacementScores", InstanceTypes=[name],
                               TargetCapacity=1, SingleAvailabilityZone=True, RegionNames=regions_of[name],
                               MaxResults=1000)

        try:
            answers = fan_out(scores_for, sorted(regions_of), self.max_workers)
        except ClientError as exc:
            # Scores are a bonus: a quota or permission refusal must not lose the prices.
            self.notes.append(f"aws: spot placement scores unavailable ({exc.response['Error'].get('Code')})")
            return
        for name, scores in zip(sorted(regions_of), answers, strict=True):
            for score in scores:
                region_facts = by_region.get(score.get("Region", ""))
                if region_facts is None:
                    continue
                for zone, value in scores_by_zone([score], region_facts.zone_names).items():
                    region_facts.scores[(name, zone)] = value

    # -- plumbing ------------------------------------------------------------------------------

    def _new_session(self) -> Any:
        try:
            import boto3
        except ImportError as exc:
            raise CloudUnavailable("aws: boto3 is not installed; skipped") from exc
        session = boto3.session.Session()
        if session.get_credentials() is None:
            raise CloudUnavailable("aws: no credentials found (environment, ~/.aws or instance role); skipped")
        return session

    def _client(self, service: str, region: str) -> Any:
        from botocore.config import Config

        endpoint = self.ec2_endpoint if service == "ec2" else self.pricing_endpoint
        # Our own retry loop (backoff with jitter, counted the same on every cloud) replaces botocore's.
        config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=32)
        with self._client_lock:  # creating clients from one session is not thread-safe
            return self._session.client(service, region_name=region, endpoint_url=endpoint, config=config)

    def _call(self, method: Any, **kwargs: Any) -> dict[str, Any]:
        return with_retries(lambda: method(**kwargs), aws_retryable, self.backoff)

    def _pages(self, method: Any, key: str, limit: int | None = None, **kwargs: Any) -> list[Any]:
        """Every page's ``key`` items; past ``limit`` items (None: no limit) no further page is asked."""
        items: list[Any] = []
        token: str | None = None
        while True:
            page = self._call(method, **kwargs, **({"NextToken": token} if token else {}))
            items.extend(page.get(key, []))
            token = page.get("NextToken") or None
            if not token or (limit is not None and len(items) > limit):
                return items


# ---------------------------------------------------------------------------------------------
# Preemption notices (node side): what this cloud's metadata service says about the node.
# ---------------------------------------------------------------------------------------------

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
        self.warnings = OnceWarnings(log)

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
            self.warnings.warn("token", f"IMDSv2 token request answered {status}")
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

    def _json(self, path: str) -> dict[str, Any] | None:
        try:
            status, body = self._get(path)
        except (OSError, urllib.error.URLError) as exc:
            self.warnings.warn("unreachable", f"instance metadata at {self.base_url} unreachable: {exc}")
            return None
        if status == 404 or status == 0:
            return None
        if status != 200:
            self.warnings.warn(f"{path}:{status}", f"{path} answered HTTP {status}; treated as no notice")
            return None
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            self.warnings.warn(f"{path}:json", f"{path} answered something that is not JSON: {body[:80]!r}")
            return None
        if not isinstance(data, dict):
            self.warnings.warn(f"{path}:shape", f"{path} answered JSON that is not an object: {body[:80]!r}")
            return None
        return data

    def poll(self) -> list[NodeNotice]:
        notices: list[NodeNotice] = []
        action = self._json("/latest/meta-data/spot/instance-action")
        if action is not None:
            kind = str(action.get("action", "")).lower()
            when = parse_iso_time(action.get("time"))
            if kind in ("terminate", "stop", "hibernate") and when is not None:
                notices.append(NodeNotice(kind, when, action))
            else:
                self.warnings.warn("action-shape", f"spot/instance-action has an unexpected shape: {str(action)[:120]}")
        rebalance = self._json("/latest/meta-data/events/recommendations/rebalance")
        if rebalance is not None and "noticeTime" in rebalance:
            notices.append(NodeNotice("rebalance", None, rebalance))
        return notices

    def acknowledge(self, notice: NodeNotice) -> None:
        """EC2 takes the node at the notice's time whatever the node says."""


MAX_EVENT_BODY = 256 * 1024  # SQS's own limit on a message; anything longer is no EventBridge event


def eventbridge_event(body: str) -> dict[str, Any] | None:
    """The EventBridge event in a message body, unwrapping an SNS envelope; None if it is not one."""
    if len(body) > MAX_EVENT_BODY:
        return None
    try:
        event = json.loads(body)
        if isinstance(event, dict) and event.get("Type") == "Notification" and "Message" in event:
            event = json.loads(event["Message"])
    except (ValueError, TypeError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None
    if not isinstance(event, dict) or not isinstance(event.get("detail"), dict):
        return None
    return event
