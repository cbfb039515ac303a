"""Azure: GPU and CPU-only VM sizes and spot/on-demand prices per region and zone (and, below, room for the
node-side preemption-notice reader).

Sources: the Retail Prices API (public, no credentials: ``serviceName eq 'Virtual Machines'`` per
region and size, following ``NextPageLink``; spot meters have ``skuName`` ending `` Spot``; Low
Priority and Windows meters are dropped) and, when a subscription and credentials are at hand,
the Compute resource SKUs (zones per region, and the restrictions a subscription has). Without
credentials the sizes come from the built-in catalog and each offer is region-wide.
azure-mgmt-compute and azure-identity are imported only inside functions.
"""

from __future__ import annotations

import email.utils
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from providers import capacity, catalog
from providers.base import SpotQuote
from providers.fetching import Backoff, JsonHttp, Progress, fan_out, with_retries
from providers.node_notice import NodeNotice, OnceWarnings

# ---------------------------------------------------------------------------------------------
# Prices and catalog
# ---------------------------------------------------------------------------------------------

DEFAULT_PRICES_URL = "https://prices.azure.com/api/retail/prices"
DEFAULT_REGIONS: tuple[str, ...] = (
    "eastus", "eastus2", "southcentralus", "westus2", "westus3", "westeurope", "northeurope",
    "uksouth", "swedencentral", "japaneast",
)


@dataclass(frozen=True, slots=True)
class RetailPrices:
    spot: float | None
    on_demand: float | None


def retail_prices(items: Iterable[dict[str, Any]]) -> dict[tuple[str, str], RetailPrices]:
    """Linux spot and on-demand hourly prices per (region, size) from Retail Prices ``Items``.

    Windows meters (``productName`` ending ``Windows``), Low Priority meters, reservations and
    dev/test rates are dropped; where a meter has several rates, the newest one counts.
    """
    newest: dict[tuple[str, str, bool], tuple[str, float]] = {}
    for item in items:
        sku_name = item.get("skuName", "")
        if (item.get("type") != "Consumption" or item.get("currencyCode", "USD") != "USD"
                or item.get("productName", "").endswith("Windows") or "Low Priority" in sku_name
                or "Low Priority" in item.get("meterName", "") or item.get("unitOfMeasure") != "1 Hour"):
            continue
        spot = sku_name.endswith(" Spot")
        key = (item["armRegionName"], item["armSkuName"], spot)
        started = item.get("effectiveStartDate", "")
        if key not in newest or started > newest[key][0]:
            newest[key] = (started, float(item["retailPrice"]))
    prices: dict[tuple[str, str], RetailPrices] = {}
    for region, size in {(r, s) for r, s, _ in newest}:
        spot_rate = newest.get((region, size, True))
        on_demand_rate = newest.get((region, size, False))
        prices[(region, size)] = RetailPrices(spot_rate[1] if spot_rate else None,
                                              on_demand_rate[1] if on_demand_rate else None)
    return prices


@dataclass(frozen=True, slots=True)
class SizeAvailability:
    """Where a size can be had in a region for this subscription: zones ("1", "2", ...) or region-wide."""

    zones: tuple[str, ...]


def availability(skus: Iterable[Any], region: str) -> dict[str, SizeAvailability]:
    """Offered sizes in ``region`` from resource SKUs, minus the subscription's restrictions."""
    found: dict[str, SizeAvailability] = {}
    for sku in skus:
        if _get(sku, "resource_type", "resourceType") != "virtualMachines":
            continue
        if region.lower() not in [loc.lower() for loc in _get(sku, "locations") or []]:
            continue
        zones: set[str] = set()
        for info in _get(sku, "location_info", "locationInfo") or []:
            if str(_get(info, "location")).lower() == region.lower():
                zones.update(_get(info, "zones") or [])
        blocked = False
        for restriction in _get(sku, "restrictions") or []:
            kind = _get(restriction, "type")
            kind = getattr(kind, "value", kind)
            details = _get(restriction, "restriction_info", "restrictionInfo") or {}
            if kind == "Location" and region.lower() in [v.lower() for v in _get(restriction, "values") or []]:
                blocked = True
            elif kind == "Zone":
                zones.difference_update(_get(details, "zones") or [])
        if not blocked:
            found[str(_get(sku, "name"))] = SizeAvailability(tuple(sorted(zones)))
    return found


def _get(obj: Any, *names: str) -> Any:
    """A field of a resource SKU given as an SDK model or as plain JSON."""
    for name in names:
        # azure-mgmt-compute's models are mappings of the wire (camelCase) names as well
        value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
        if value is not None and not callable(value):
            return value
    return None


def quoted_sizes(cpu_types: bool = True) -> list[catalog.InstanceType]:
    """The catalog's Azure sizes the poller prices: the GPU sizes, then (unless ``cpu_types`` is False) the
    CPU-only ones."""
    return [*catalog.instance_types("azure"), *(catalog.cpu_instance_types("azure") if cpu_types else [])]


def azure_quotes(region: str, prices: dict[tuple[str, str], RetailPrices],
                 sizes: dict[str, SizeAvailability] | None, observed_at: datetime,
                 cpu_types: bool = True) -> list[SpotQuote]:
    """One quote per catalog size priced in ``region`` (GPU sizes, and CPU-only ones with no accelerator):
    per zone where the resource SKUs say so, region-wide (zone = region) without them."""
    quotes = []
    for size in quoted_sizes(cpu_types):
        price = prices.get((region, size.name))
        if price is None:
            continue
        if sizes is None:
            zones = [region]
        elif size.name not in sizes:
            continue
        else:
            zones = [f"{region}-{z}" for z in sizes[size.name].zones] or [region]
        for zone in zones:
            quotes.append(SpotQuote(
                cloud="azure", region=region, zone=zone, instance_type=size.name, accelerator=size.accelerator,
                gpus_per_node=size.gpus, gpu_memory_gb=size.gpu_memory_gb if size.gpus else None,
                spot_price=price.spot,
                on_demand_price=price.on_demand, observed_at=observed_at,
            ))
    return quotes


# Sizes named in one Retail Prices filter: with the CPU-only sizes the catalog's Azure list is ~75 names,
# and one filter naming them all makes a ~4 KB query string; batches keep each request's URL short.
FILTER_SIZES = 40


def retail_filter(region: str, sizes: Iterable[str]) -> str:
    names = " or ".join(f"armSkuName eq '{s}'" for s in sizes)
    return f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and ({names})"


def retail_filters(region: str, sizes: list[str], batch: int = FILTER_SIZES) -> list[str]:
    """``retail_filter`` over ``sizes`` in batches of at most ``batch`` names."""
    return [retail_filter(region, sizes[start:start + batch]) for start in range(0, len(sizes), batch)]


# -- Spot Placement Score (``Microsoft.Compute/locations/{location}/placementScores/spot/generate``) -----

PLACEMENT_API_VERSION = "2025-06-05"
PLACEMENT_LEVELS = frozenset({"High", "Medium", "Low"})
# Scores that say "no score here" rather than how likely a request is: no level, no note.
PLACEMENT_NO_DATA = frozenset({"DataNotFoundOrStale", "RestrictedSkuNotAvailable", "SkuNotAvailable"})
PLACEMENT_MAX_REGIONS, PLACEMENT_MAX_SIZES = 8, 5  # the most one request may name


def placement_request(regions: list[str], sizes: list[str], count: int = 1) -> dict[str, Any]:
    return {"desiredLocations": regions, "desiredSizes": [{"sku": s} for s in sizes], "desiredCount": count,
            "availabilityZones": True}


def placement_levels(answer: Any, where: str, note: Callable[[str], None]) -> dict[tuple[str, str], str]:
    """The placement level per (zone, size) of a Spot Placement Score answer; zone is ``region-N`` for a
    zonal score and the region for a regional one. Each unusable entry is refused alone, with a note."""
    scores = answer.get("placementScores") if isinstance(answer, dict) else None
    if not isinstance(scores, list):
        note(f"azure: spot placement score {where}: placementScores: not a list; no placement scores")
        return {}
    found: dict[tuple[str, str], str] = {}
    for i, entry in enumerate(scores[:1000]):
        field = f"placementScores[{i}]"
        if not isinstance(entry, dict):
            note(f"azure: spot placement score {where}: {field}: not an object; skipped")
            continue
        size, region, zone, level = (entry.get(k) for k in ("sku", "region", "availabilityZone", "score"))
        if not (isinstance(size, str) and _SIZE.fullmatch(size)) or not (isinstance(region, str)
                                                                          and _REGION.fullmatch(region)):
            note(f"azure: spot placement score {where}: {field}: no usable sku or region; skipped")
            continue
        if zone not in (None, "") and not (isinstance(zone, str) and zone.isdigit() and len(zone) <= 2):
            note(f"azure: spot placement score {where}: {field}.availabilityZone: not a zone number; skipped")
            continue
        if level in PLACEMENT_NO_DATA:
            continue
        if level not in PLACEMENT_LEVELS:
            text = repr(level) if len(repr(level)) <= 60 else repr(level)[:57] + "..."
            note(f"azure: spot placement score {where}: {field}.score: not High, Medium or Low ({text}); refused")
            continue
        found[(f"{region.lower()}-{zone}" if zone else region.lower(), size)] = str(level)
    return found


_SIZE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,79}")
_REGION = re.compile(r"[A-Za-z][A-Za-z0-9]{0,39}")


def azure_retryable(exc: BaseException) -> bool:
    from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

    if isinstance(exc, HttpResponseError):
        return exc.status_code in (429, 500, 502, 503, 504)
    return isinstance(exc, (ServiceRequestError, ServiceResponseError))


class AzurePriceSource:
    """Polls the Retail Prices API per region, with resource SKUs when a subscription is set."""

    cloud = "azure"

    def __init__(self, regions: Iterable[str] = DEFAULT_REGIONS, prices_url: str = DEFAULT_PRICES_URL,
                 rm_endpoint: str | None = None, subscription_id: str | None = None, credential: Any = None,
                 backoff: Backoff | None = None, max_workers: int = 16, cpu_types: bool = True,
                 placement_scores: bool = True, placement_count: int = 1, placement_interval_s: float = 0.05,
                 placement_ttl_s: float = 600.0,
                 placement_state: tuple[capacity.Throttle, capacity.TtlCache] | None = None) -> None:
        self.regions = list(regions)
        # Spot Placement Score: one request per 8 regions x 5 sizes, throttled and cached
        self.placement_scores = placement_scores
        self.placement_count = placement_count
        # placement_state: a throttle and cache shared by every poller of this process (see providers.sources)
        self.throttle, self.placement_cache = placement_state or (capacity.Throttle(placement_interval_s),
                                                                  capacity.TtlCache(placement_ttl_s))
        self.cpu_types = cpu_types  # False: GPU sizes only (the catalog's CPU-only sizes are left out)
        self.prices_url = prices_url
        self.rm_endpoint = rm_endpoint
        self.subscription_id = subscription_id
        self.credential = credential
        self.backoff = backoff or Backoff()
        self.max_workers = max_workers
        self.notes: list[str] = []

    def fetch_quotes(self, regions: list[str] | None = None, progress: Progress | None = None) -> list[SpotQuote]:
        self.notes = []
        wanted = regions or self.regions
        observed_at = datetime.now(UTC)
        compute = self._compute_client()
        http = JsonHttp(self.backoff)
        try:
            sizes = [t.name for t in quoted_sizes(self.cpu_types)]

            def one_region(region: str) -> list[SpotQuote]:
                items = [item for expression in retail_filters(region, sizes)
                         for item in self._retail_items(http, expression)]
                available = self._availability(compute, region) if compute is not None else None
                return azure_quotes(region, retail_prices(items), available, observed_at, self.cpu_types)

            quotes = [q for quotes in fan_out(one_region, wanted, self.max_workers, progress) for q in quotes]
        finally:
            http.close()
        if compute is not None and self.placement_scores:
            quotes = self.with_placement_scores(quotes)
        return quotes

    def with_placement_scores(self, quotes: list[SpotQuote]) -> list[SpotQuote]:
        """The quotes with the Spot Placement Score of each spot-priced GPU size. Scores are a bonus: a
        request that fails or an answer refused loses only its own scores, with a note."""
        notes = capacity.Notes(self.notes)
        regions = sorted({q.region for q in quotes if q.gpus_per_node and q.spot_price is not None})
        sizes = sorted({q.instance_type for q in quotes if q.gpus_per_node and q.spot_price is not None})
        if not regions:
            return quotes
        try:
            token = self.credential.get_token("https://management.azure.com/.default").token
        except Exception as exc:  # no usable credential: prices without scores
            notes.add(f"azure: no token for spot placement scores ({capacity.failure(exc)}); no placement scores")
            return quotes
        base = (self.rm_endpoint or "https://management.azure.com").rstrip("/")
        batches = [(tuple(regions[r:r + PLACEMENT_MAX_REGIONS]), tuple(sizes[s:s + PLACEMENT_MAX_SIZES]))
                   for r in range(0, len(regions), PLACEMENT_MAX_REGIONS)
                   for s in range(0, len(sizes), PLACEMENT_MAX_SIZES)]

        def ask(batch: tuple[tuple[str, ...], tuple[str, ...]]) -> dict[tuple[str, str], str]:
            in_regions, of_sizes = batch
            cache_key = (base, self.subscription_id, in_regions, of_sizes, self.placement_count)
            cached = self.placement_cache.get(cache_key)
            if cached is not None:
                return dict(cached)
            where = f"{in_regions[0]}..{in_regions[-1]} {of_sizes[0]}..{of_sizes[-1]}"
            url = (f"{base}/subscriptions/{self.subscription_id}/providers/Microsoft.Compute/locations/"
                   f"{in_regions[0]}/placementScores/spot/generate?api-version={PLACEMENT_API_VERSION}")
            try:
                answer = capacity.post_json(url, placement_request(list(in_regions), list(of_sizes),
                                                                   self.placement_count),
                                            {"Authorization": f"Bearer {token}"}, self.backoff, self.throttle)
            except Exception as exc:
                notes.add(f"azure: spot placement score {where} unavailable ({capacity.failure(exc)})")
                return {}
            levels = placement_levels(answer, where, notes.add)
            self.placement_cache.put(cache_key, levels)
            return levels

        found: dict[tuple[str, str], str] = {}
        for levels in fan_out(ask, batches, self.max_workers):
            found.update(levels)
        notes.close("azure")
        return [replace(q, placement_level=found[(q.zone, q.instance_type)])
                if q.gpus_per_node and (q.zone, q.instance_type) in found else q for q in quotes]

    def _retail_items(self, http: JsonHttp, expression: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        page = http.get(self.prices_url, params={"$filter": expression})
        while True:
            items.extend(page.get("Items", []))
            next_link = page.get("NextPageLink")
            if not next_link:
                return items
            page = http.get(next_link)

    def _availability(self, compute: Any, region: str) -> dict[str, SizeAvailability] | None:
        from azure.core.exceptions import ClientAuthenticationError

        def listing() -> list[Any]:
            # enforce_https=False lets an http:// proxy or emulator endpoint carry the bearer token.
            return list(compute.resource_skus.list(filter=f"location eq '{region}'",
                                                   enforce_https=not self._plain_http()))

        try:
            return availability(with_retries(listing, azure_retryable, self.backoff), region)
        except ClientAuthenticationError as exc:
            # The prices are public: lose only the zones, not the cloud.
            note = f"azure: no usable credentials for resource SKUs ({type(exc).__name__}); zones not checked"
            if note not in self.notes:
                self.notes.append(note)
            return None

    def _plain_http(self) -> bool:
        return bool(self.rm_endpoint and self.rm_endpoint.startswith("http://"))

    def _compute_client(self) -> Any:
        if not self.subscription_id:
            self.notes.append("azure: no subscription set; public list prices, region-wide, zones not checked")
            return None
        try:
            from azure.mgmt.compute import ComputeManagementClient
        except ImportError:
            self.notes.append("azure: azure-mgmt-compute not installed; zones not checked")
            return None
        if self.credential is None:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError:
                self.notes.append("azure: azure-identity not installed; zones not checked")
                return None
            self.credential = DefaultAzureCredential()
        credential = self.credential
        kwargs: dict[str, Any] = {"retry_total": 0}  # our retry loop replaces azure-core's
        if self.rm_endpoint:
            kwargs["base_url"] = self.rm_endpoint
        return ComputeManagementClient(credential, self.subscription_id, **kwargs)


# ---------------------------------------------------------------------------------------------
# Preemption notices (node side): what this cloud's metadata service says about the node.
# ---------------------------------------------------------------------------------------------

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
        self.warnings = OnceWarnings()

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
