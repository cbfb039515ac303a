"""GCP: the GPU catalog and spot/on-demand prices per zone (and, below, room for the node-side
preemption-notice reader).

Sources: the Cloud Billing Catalog (``services/6F81-5844-456A/skus``: GPU, vCPU and RAM SKUs per
region, ``usageType`` ``OnDemand`` and ``Preemptible`` = spot, price ``units + nanos/1e9``) and
Compute Engine ``machineTypes``/``acceleratorTypes`` aggregated lists (which zone has what). A GPU
machine type costs its GPUs plus its vCPUs plus its memory: a2, a3, a4 and g2 types bundle their GPUs,
n1 types take attached GPUs. google-cloud-compute and google-auth are imported only inside functions.
"""

from __future__ import annotations

import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from providers import capacity, catalog, gcp_history
from providers.base import CloudUnavailable, SpotQuote
from providers.fetching import Backoff, JsonHttp, Progress, fan_out, with_retries
from providers.node_notice import NodeNotice, OnceWarnings

# ---------------------------------------------------------------------------------------------
# Prices and catalog
# ---------------------------------------------------------------------------------------------

COMPUTE_SERVICE = "services/6F81-5844-456A"
DEFAULT_BILLING_ENDPOINT = "https://cloudbilling.googleapis.com"
SPOT, ON_DEMAND = "Preemptible", "OnDemand"

# Compute Engine accelerator type -> (catalog name, GPU memory GB, words naming it in SKU descriptions).
# H200 and B200: the type names of Compute Engine's GPU docs (A3 Ultra, A4), the SKU words and GPU
# memory of SkyPilot's catalog fetcher (sky/catalog/data_fetchers/fetch_gcp.py, Apache-2.0):
# "H200 141GB GPU running in ..." and "A4 Nvidia B200 (1 gpu slice) running in ...".
ACCELERATORS: dict[str, tuple[str, float, str]] = {
    "nvidia-b200": ("B200", 180, "Nvidia B200 (1 gpu slice)"),
    "nvidia-h200-141gb": ("H200", 141, "H200 141GB GPU"),
    "nvidia-h100-80gb": ("H100", 80, "H100 80GB GPU"),
    "nvidia-h100-mega-80gb": ("H100-MEGA", 80, "H100 80GB Mega GPU"),
    "nvidia-a100-80gb": ("A100-80GB", 80, "A100 80GB GPU"),
    "nvidia-tesla-a100": ("A100", 40, "Tesla A100 GPU"),
    "nvidia-l4": ("L4", 24, "L4 GPU"),
    "nvidia-tesla-v100": ("V100", 16, "Tesla V100 GPU"),
    "nvidia-tesla-t4": ("T4", 16, "Tesla T4 GPU"),
    "nvidia-tesla-p100": ("P100", 16, "Tesla P100 GPU"),
}
# Machine series -> the words naming its vCPU ("... Core") and memory ("... Ram") SKUs: SkyPilot's
# SERIES_TO_DESCRIPTION (fetch_gcp.py) for a4 and c2 ("Compute optimized"), the billing catalog's
# "A3Ultra Instance Core/Ram" for a3-ultragpu as "A3Plus" names a3-megagpu's. Longest prefixes first.
SERIES: dict[str, str] = {
    "a3-megagpu": "A3Plus Instance",
    "a3-ultragpu": "A3Ultra Instance",
    "a3": "A3 Instance",
    "a4": "A4 Instance",
    "a2": "A2 Instance",
    "g2": "G2 Instance",
    "n1": "N1 Predefined Instance",
    "c2": "Compute optimized",
}
# Words that mark a SKU for another way of buying the same resource (commitments, sole tenancy,
# Dynamic Workload Scheduler, workstation licences): not the spot or on-demand list price.
EXCLUDED_WORDS = ("custom", "premium", "reserved", "sole tenancy", "commitment", "dws", "calendar",
                  "flex", "virtual workstation", "extended")


def sku_price(sku: dict[str, Any]) -> float | None:
    """The hourly unit price of a SKU: its last tier's ``units + nanos / 1e9``."""
    infos = sku.get("pricingInfo") or []
    if not infos:
        return None
    tiers = infos[0].get("pricingExpression", {}).get("tieredRates") or []
    if not tiers:
        return None
    price = tiers[-1].get("unitPrice", {})
    return int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9


@dataclass(frozen=True, slots=True)
class SkuPrices:
    """Unit prices by (usage type, region, kind, name): kind is gpu (name = accelerator type) or
    core/ram (name = machine series)."""

    prices: dict[tuple[str, str, str, str], float]

    def get(self, usage: str, region: str, kind: str, name: str) -> float | None:
        return self.prices.get((usage, region, kind, name))


def index_skus(skus: Iterable[dict[str, Any]]) -> SkuPrices:
    prices: dict[tuple[str, str, str, str], float] = {}
    for sku in skus:
        category = sku.get("category", {})
        usage = category.get("usageType")
        if usage not in (SPOT, ON_DEMAND) or category.get("resourceFamily") != "Compute":
            continue
        description = sku.get("description", "")
        lowered = description.lower()
        if any(word in lowered for word in EXCLUDED_WORDS):
            continue
        match = _classify(category.get("resourceGroup", ""), description)
        price = sku_price(sku)
        if match is None or price is None:
            continue
        for region in sku.get("serviceRegions", []):
            prices[(usage, region, *match)] = price
    return SkuPrices(prices)


def _classify(group: str, description: str) -> tuple[str, str] | None:
    if group == "GPU":
        for name, (_, _, words) in ACCELERATORS.items():
            if re.search(rf"(^|\s){re.escape(words)}(\s|$)", description):
                return "gpu", name
        return None
    for series, words in SERIES.items():
        if f"{words} Core" in description:
            return "core", series
        if f"{words} Ram" in description:
            return "ram", series
    return None


def series_of(machine_type: str) -> str | None:
    for series in SERIES:  # longest prefixes first, as SERIES is ordered
        if machine_type.startswith(series + "-"):
            return series
    return None


@dataclass(frozen=True, slots=True)
class MachineType:
    name: str
    zone: str
    vcpus: int
    memory_gib: float
    accelerator: str | None  # Compute Engine accelerator type bundled with it
    gpus: int

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


def machine_type_from_record(record: dict[str, Any], zone: str) -> MachineType:
    accelerators = record.get("accelerators") or []
    first = accelerators[0] if accelerators else {}
    return MachineType(
        name=record["name"], zone=zone, vcpus=int(record["guestCpus"]),
        memory_gib=float(record["memoryMb"]) / 1024,
        accelerator=first.get("guestAcceleratorType") or first.get("guest_accelerator_type"),
        gpus=int(first.get("guestAcceleratorCount") or first.get("guest_accelerator_count") or 0),
    )


def node_price(prices: SkuPrices, usage: str, machine: MachineType, accelerator: str, gpus: int) -> float | None:
    """GPUs + vCPUs + memory of one node, or None when any of the three SKUs is missing."""
    series = series_of(machine.name)
    if series is None:
        return None
    gpu = prices.get(usage, machine.region, "gpu", accelerator) if gpus else 0.0
    core = prices.get(usage, machine.region, "core", series)
    ram = prices.get(usage, machine.region, "ram", series)
    if gpu is None or core is None or ram is None:
        return None
    return gpus * gpu + machine.vcpus * core + machine.memory_gib * ram


def gcp_quotes(prices: SkuPrices, machines: Iterable[MachineType], zone_accelerators: dict[str, dict[str, int]],
               observed_at: datetime) -> list[SpotQuote]:
    """One quote per offer in each zone: bundled a2/a3/a4/g2 types, n1 types with the GPUs the
    built-in catalog attaches to them where the zone has that accelerator, and the catalog's
    CPU-only types (no GPU: accelerator "", 0 per node)."""
    cpu_only = {t.name for t in catalog.cpu_instance_types("gcp")}
    quotes = []
    for machine in machines:
        offers: list[tuple[str, int]] = []
        if machine.accelerator and machine.gpus:
            offers.append((machine.accelerator, machine.gpus))
        elif machine.name in cpu_only:
            offers.append(("", 0))
        else:
            for entry in catalog.instance_types("gcp"):
                if entry.name != machine.name or not entry.attached:
                    continue
                accelerator = _accelerator_type(entry.accelerator)
                if accelerator and zone_accelerators.get(machine.zone, {}).get(accelerator, 0) >= entry.gpus:
                    offers.append((accelerator, entry.gpus))
        for accelerator, gpus in offers:
            label, memory, _ = ACCELERATORS.get(accelerator, (accelerator, 0.0, ""))
            spot = node_price(prices, SPOT, machine, accelerator, gpus)
            on_demand = node_price(prices, ON_DEMAND, machine, accelerator, gpus)
            if spot is None and on_demand is None:
                continue
            quotes.append(SpotQuote(
                cloud="gcp", region=machine.region, zone=machine.zone, instance_type=machine.name,
                accelerator=label, gpus_per_node=gpus, gpu_memory_gb=memory or None,
                spot_price=_round(spot), on_demand_price=_round(on_demand), observed_at=observed_at,
            ))
    return quotes


def _accelerator_type(label: str) -> str | None:
    for name, (known, _, _) in ACCELERATORS.items():
        if known == label:
            return name
    return None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def machine_type_filter(cpu_types: bool = True) -> str:
    """A Compute Engine list filter (RE2 on the name) for the machine types worth pricing: the GPU
    series, the n1 types GPUs attach to, and the catalog's CPU-only types (by name, so the listing
    stays the size of the catalog)."""
    bundled = [f"{series}-.*" for series in ("a2", "a3", "a4", "g2")]
    named = sorted({t.name for t in catalog.instance_types("gcp") if t.attached}
                   | ({t.name for t in catalog.cpu_instance_types("gcp")} if cpu_types else set()))
    return f'name eq "({"|".join(bundled + named)})"'


# -- capacity advice (Compute Engine v1 ``advice.capacity``) ---------------------------------------

DEFAULT_COMPUTE_ENDPOINT = "https://compute.googleapis.com"
_NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")


def advice_request(machine_type: str, zones: Iterable[str], size: int = 1) -> dict[str, Any]:
    """The ``CapacityAdviceRequest`` body for ``size`` Spot VMs of one machine type in any one of ``zones``."""
    return {
        "instanceProperties": {"scheduling": {"provisioningModel": "SPOT"}},
        "instanceFlexibilityPolicy": {"instanceSelections": {"broker": {"machineTypes": [machine_type]}}},
        "size": size,
        "distributionPolicy": {"zones": [{"zone": f"zones/{z}"} for z in sorted(zones)],
                               "targetShape": "ANY_SINGLE_ZONE"},
    }


def _last_name(value: Any) -> str | None:
    """``us-central1-a`` from a zone (or machine type) given as a name, ``zones/...`` or a URL."""
    if not isinstance(value, str) or len(value) > 300:
        return None
    name = value.rstrip("/").rsplit("/", 1)[-1]
    return name if _NAME.fullmatch(name) else None


def advice_scores(answer: Any, where: str, note: Callable[[str], None]
                  ) -> dict[tuple[str, str], tuple[float | None, float | None]]:
    """(obtainability, estimated uptime in seconds) per (zone, machine type) of a ``CapacityAdviceResponse``.

    Recommendations come best first, so the first one naming a shard wins. Each unusable field is
    refused alone (a note names it); a recommendation with neither score usable gives nothing.
    """
    if not isinstance(answer, dict) or not isinstance(answer.get("recommendations", []), list):
        note(f"gcp: advice.capacity {where}: recommendations: not a list; no capacity advice")
        return {}
    found: dict[tuple[str, str], tuple[float | None, float | None]] = {}
    for i, recommendation in enumerate(answer.get("recommendations", [])[:1000]):
        field = f"recommendations[{i}]"
        scores = recommendation.get("scores") if isinstance(recommendation, dict) else None
        shards = recommendation.get("shards") if isinstance(recommendation, dict) else None
        if not isinstance(scores, dict) or not isinstance(shards, list):
            note(f"gcp: advice.capacity {where}: {field}: no scores or shards; skipped")
            continue
        obtainability = uptime = None
        try:
            if "obtainability" in scores:
                obtainability = capacity.probability(scores["obtainability"], f"{field}.scores.obtainability")
        except capacity.FieldRefused as exc:
            note(f"gcp: advice.capacity {where}: {exc}; refused")
        try:
            if "estimatedUptime" in scores:
                uptime = capacity.duration_s(scores["estimatedUptime"], f"{field}.scores.estimatedUptime")
        except capacity.FieldRefused as exc:
            note(f"gcp: advice.capacity {where}: {exc}; refused")
        if obtainability is None and uptime is None:
            continue
        for j, shard in enumerate(shards[:1000]):
            zone = _last_name(shard.get("zone")) if isinstance(shard, dict) else None
            machine = _last_name(shard.get("machineType")) if isinstance(shard, dict) else None
            if zone is None or machine is None:
                note(f"gcp: advice.capacity {where}: {field}.shards[{j}]: no usable zone or machineType; skipped")
                continue
            found.setdefault((zone, machine), (obtainability, uptime))
    return found


def gcp_retryable(exc: BaseException) -> bool:
    from google.api_core import exceptions

    retryable = (exceptions.TooManyRequests, exceptions.InternalServerError, exceptions.BadGateway,
                 exceptions.ServiceUnavailable, exceptions.GatewayTimeout)
    if isinstance(exc, retryable):
        return True
    import requests

    return isinstance(exc, requests.ConnectionError)


class GcpPriceSource:
    """Polls the billing catalog and the zone listings side by side; implements ``PriceSource``."""

    cloud = "gcp"
    backfill_days = 0.0  # days of ``history`` a process's first poll stores (broker.market.backfill)

    def __init__(self, project: str | None = None, regions: Iterable[str] | None = None,
                 compute_endpoint: str | None = None, billing_endpoint: str | None = None,
                 api_key: str | None = None, credentials: Any = None, backoff: Backoff | None = None,
                 cpu_types: bool = True, capacity_advice: bool = True, advice_size: int = 1,
                 advice_interval_s: float = 0.05, advice_ttl_s: float = 600.0, max_workers: int = 8,
                 advice_state: tuple[capacity.Throttle, capacity.TtlCache] | None = None,
                 capacity_history: bool = True, history_cache: capacity.TtlCache | None = None) -> None:
        self.project = project
        # advice.capacityHistory: one request per GPU machine type and region, cached for hours
        self.capacity_history = capacity_history
        self.history_cache = history_cache or capacity.TtlCache(gcp_history.CACHE_S)
        self.histories: dict[tuple[str, str], gcp_history.CapacityHistory] = {}
        self.last_quotes: list[SpotQuote] = []
        # advice.capacity: one request per GPU machine type and region, throttled and cached
        self.capacity_advice = capacity_advice
        self.advice_size = advice_size
        # advice_state: a throttle and cache shared by every poller of this process (see providers.sources)
        self.throttle, self.advice_cache = advice_state or (capacity.Throttle(advice_interval_s),
                                                            capacity.TtlCache(advice_ttl_s))
        self.max_workers = max_workers
        self.cpu_types = cpu_types  # False: GPU machine types only
        self.regions = list(regions) if regions else None
        self.compute_endpoint = compute_endpoint
        self.billing_endpoint = (billing_endpoint or DEFAULT_BILLING_ENDPOINT).rstrip("/")
        self.api_key = api_key
        self.credentials = credentials
        self.backoff = backoff or Backoff()
        self.notes: list[str] = []

    def fetch_quotes(self, regions: list[str] | None = None, progress: Progress | None = None) -> list[SpotQuote]:
        self.notes = []
        credentials, project = self._credentials()
        wanted = set(regions or self.regions or [])
        observed_at = datetime.now(UTC)
        # The three listings are global (every region in one paginated answer): they run side by side.
        jobs: list[Callable[[], Any]] = [
            lambda: self._skus(credentials),
            lambda: self._machine_types(credentials, project),
            lambda: self._accelerator_types(credentials, project),
        ]
        skus, machines, accelerators = fan_out(lambda job: job(), jobs, progress=progress)
        if wanted:
            machines = [m for m in machines if m.region in wanted]
        quotes = gcp_quotes(index_skus(skus), machines, accelerators, observed_at)
        if self.capacity_advice:
            quotes = self._with_capacity_advice(quotes, credentials, project)
        if self.capacity_history:
            self.histories = self._capacity_history(quotes, credentials, project)
            quotes = gcp_history.with_latest_rates(quotes, self.histories)
        self.last_quotes = quotes
        return quotes

    def history(self, since: datetime) -> list[SpotQuote]:
        """Past quotes since ``since`` from the last poll's ``advice.capacityHistory`` (for the price
        book's backfill); empty before a poll or with the history turned off."""
        return gcp_history.history_quotes(self.last_quotes, self.histories, since)

    def _capacity_history(self, quotes: list[SpotQuote], credentials: Any, project: str
                          ) -> dict[tuple[str, str], gcp_history.CapacityHistory]:
        """``advice.capacityHistory`` per spot-priced GPU machine type and region; a failed request
        loses only its own history, with a note."""
        wanted = sorted({(q.region, q.instance_type) for q in quotes if q.gpus_per_node and q.spot_price is not None})
        if not wanted:
            return {}
        notes = capacity.Notes(self.notes)
        try:
            headers = self._bearer_headers(credentials)
        except Exception as exc:
            notes.add(f"gcp: no token for advice.capacityHistory ({capacity.failure(exc)}); no history")
            return {}
        base = (self.compute_endpoint or DEFAULT_COMPUTE_ENDPOINT).rstrip("/")

        def ask(key: tuple[str, str]) -> tuple[tuple[str, str], gcp_history.CapacityHistory | None]:
            region, machine = key
            cache_key = ("history", base, project, region, machine)
            cached = self.history_cache.get(cache_key)
            if cached is not None:
                return key, cached
            where = f"{region} {machine}"
            try:
                answer = capacity.post_json(
                    f"{base}/compute/v1/projects/{project}/regions/{region}/advice/capacityHistory",
                    gcp_history.history_request(machine), headers, self.backoff, self.throttle)
            except Exception as exc:
                notes.add(f"gcp: advice.capacityHistory {where} unavailable ({capacity.failure(exc)})")
                return key, None
            found = gcp_history.parse_history(answer, where, notes.add)
            self.history_cache.put(cache_key, found)
            return key, found

        histories = {key: found for key, found in fan_out(ask, wanted, self.max_workers) if found is not None}
        notes.close("gcp")
        return histories

    # -- capacity advice -----------------------------------------------------------------------

    def _with_capacity_advice(self, quotes: list[SpotQuote], credentials: Any, project: str) -> list[SpotQuote]:
        """The quotes with ``advice.capacity``'s scores for each spot-priced GPU machine type. Advice is a
        bonus: a request that fails or an answer refused loses only its own scores, with a note."""
        zones_of: dict[tuple[str, str], set[str]] = {}
        for q in quotes:
            if q.gpus_per_node and q.spot_price is not None:
                zones_of.setdefault((q.region, q.instance_type), set()).add(q.zone)
        if not zones_of:
            return quotes
        notes = capacity.Notes(self.notes)
        try:
            headers = self._bearer_headers(credentials)
        except Exception as exc:  # a token that cannot be refreshed: prices without advice
            notes.add(f"gcp: no token for advice.capacity ({capacity.failure(exc)}); no capacity advice")
            return quotes
        base = (self.compute_endpoint or DEFAULT_COMPUTE_ENDPOINT).rstrip("/")

        def ask(key: tuple[str, str]) -> dict[tuple[str, str], tuple[float | None, float | None]]:
            region, machine = key
            zones = tuple(sorted(zones_of[key]))
            cache_key = (base, project, region, machine, zones, self.advice_size)
            cached = self.advice_cache.get(cache_key)
            if cached is not None:
                return dict(cached)
            where = f"{region} {machine}"
            try:
                answer = capacity.post_json(
                    f"{base}/compute/v1/projects/{project}/regions/{region}/advice/capacity",
                    advice_request(machine, zones, self.advice_size), headers, self.backoff, self.throttle)
            except Exception as exc:
                notes.add(f"gcp: advice.capacity {where} unavailable ({capacity.failure(exc)})")
                return {}
            scores = advice_scores(answer, where, notes.add)
            self.advice_cache.put(cache_key, scores)
            return scores

        found: dict[tuple[str, str], tuple[float | None, float | None]] = {}
        for scores in fan_out(ask, sorted(zones_of), self.max_workers):
            found.update(scores)
        notes.close("gcp")
        return [replace(q, obtainability=found[(q.zone, q.instance_type)][0],
                        estimated_uptime_s=found[(q.zone, q.instance_type)][1])
                if (q.zone, q.instance_type) in found and q.gpus_per_node else q for q in quotes]

    # -- listings ------------------------------------------------------------------------------

    def _skus(self, credentials: Any) -> list[dict[str, Any]]:
        http = JsonHttp(self.backoff, headers=self._billing_headers(credentials))
        url = f"{self.billing_endpoint}/v1/{COMPUTE_SERVICE}/skus"
        skus: list[dict[str, Any]] = []
        token = ""
        try:
            while True:
                params = {"pageSize": "5000", "currencyCode": "USD"}
                if self.api_key:
                    params["key"] = self.api_key
                if token:
                    params["pageToken"] = token
                page = http.get(url, params=params)
                skus.extend(page.get("skus", []))
                token = page.get("nextPageToken", "")
                if not token:
                    return skus
        finally:
            http.close()

    def _machine_types(self, credentials: Any, project: str) -> list[MachineType]:
        from google.cloud import compute_v1

        client = compute_v1.MachineTypesClient(credentials=credentials, transport="rest",
                                               client_options=self._client_options())
        request = compute_v1.AggregatedListMachineTypesRequest(project=project,
                                                               filter=machine_type_filter(self.cpu_types),
                                                               max_results=500)
        machines = []
        for scope, listed in self._aggregated(client, request):
            zone = scope.removeprefix("zones/")
            for record in listed.machine_types:
                machines.append(machine_type_from_record(_machine_record(record), zone))
        return machines

    def _accelerator_types(self, credentials: Any, project: str) -> dict[str, dict[str, int]]:
        from google.cloud import compute_v1

        client = compute_v1.AcceleratorTypesClient(credentials=credentials, transport="rest",
                                                   client_options=self._client_options())
        request = compute_v1.AggregatedListAcceleratorTypesRequest(project=project, max_results=500)
        zones: dict[str, dict[str, int]] = {}
        for scope, listed in self._aggregated(client, request):
            zone = scope.removeprefix("zones/")
            for accelerator in listed.accelerator_types:
                zones.setdefault(zone, {})[accelerator.name] = int(accelerator.maximum_cards_per_instance)
        return zones

    def _aggregated(self, client: Any, request: Any) -> list[tuple[str, Any]]:
        """Every (scope, scoped list) of an aggregated listing, one retried request per page."""
        scopes: list[tuple[str, Any]] = []
        while True:
            # retry=None: the SDK's own retry would stack under ours.
            page = with_retries(lambda: client.aggregated_list(request=request, retry=None), gcp_retryable,
                                self.backoff)
            scopes.extend(page.items.items())
            if not page.next_page_token:
                return scopes
            request.page_token = page.next_page_token

    # -- credentials -----------------------------------------------------------------------------

    def _credentials(self) -> tuple[Any, str]:
        credentials = self.credentials
        project = self.project or os.environ.get("GOOGLE_CLOUD_PROJECT")
        if credentials is None:
            try:
                import google.auth
                from google.auth.exceptions import DefaultCredentialsError
            except ImportError as exc:
                raise CloudUnavailable("gcp: google-cloud-compute is not installed; skipped") from exc
            try:
                credentials, default_project = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"])
                project = project or default_project
            except DefaultCredentialsError:
                if not self.compute_endpoint:
                    raise CloudUnavailable(
                        "gcp: no application default credentials (run `gcloud auth application-default "
                        "login` or set GOOGLE_APPLICATION_CREDENTIALS); skipped") from None
                # An overridden endpoint is a proxy or emulator that does its own authentication.
                from google.auth.credentials import AnonymousCredentials

                credentials = AnonymousCredentials()
        if not project:
            raise CloudUnavailable("gcp: no project (set BROKER_GCP_PROJECT or GOOGLE_CLOUD_PROJECT); skipped")
        return credentials, project

    def _billing_headers(self, credentials: Any) -> dict[str, str]:
        return {} if self.api_key else self._bearer_headers(credentials)

    def _bearer_headers(self, credentials: Any) -> dict[str, str]:
        from google.auth.credentials import AnonymousCredentials

        if isinstance(credentials, AnonymousCredentials):
            return {}
        import google.auth.transport.requests

        credentials.refresh(google.auth.transport.requests.Request())
        return {"Authorization": f"Bearer {credentials.token}"}

    def _client_options(self) -> dict[str, str]:
        return {"api_endpoint": self.compute_endpoint} if self.compute_endpoint else {}


def _machine_record(record: Any) -> dict[str, Any]:
    return {
        "name": record.name, "guestCpus": record.guest_cpus, "memoryMb": record.memory_mb,
        "accelerators": [{"guestAcceleratorType": a.guest_accelerator_type,
                          "guestAcceleratorCount": a.guest_accelerator_count} for a in record.accelerators],
    }


# ---------------------------------------------------------------------------------------------
# Preemption notices (node side): what this cloud's metadata service says about the node.
# ---------------------------------------------------------------------------------------------

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
        self.warnings = OnceWarnings()
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
