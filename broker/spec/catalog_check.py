"""Instance types, accelerators and regions checked against a cloud catalog.

SkyPilot's catalog is preferred: it is what SkyPilot will provision from. It lives in CSV files
that SkyPilot downloads on first use (and refreshes every few hours) with no timeout of its own,
so each cloud's lookups run in a daemon thread under one shared deadline. A cloud whose catalog
cannot be fetched in time, or fails to load, is checked against ``providers.catalog`` instead,
and its errors say so.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import pathlib
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from broker.spec.errors import MAX_MESSAGE_CHARS, SpecError
from broker.spec.resources import AcceleratorRequest, ResourceAlternative
from broker.spec.yaml_lines import LoadedYaml, Path, format_path
from providers.base import PUBLIC_CLOUDS

CATALOG_TIMEOUT_SECONDS = 3.0
# After SkyPilot's catalog could not be fetched, the built-in one answers for this long without
# trying again, in this process and (through a marker file) in the next `broker` commands.
UNREACHABLE_FOR_SECONDS = 15 * 60.0
_unreachable_until: dict[str, float] = {}


@dataclass
class CloudFacts:
    """What one cloud's catalog says about the names a job file uses."""

    cloud: str
    accelerators: dict[str, set[int]]  # canonical name -> GPU counts per node on offer
    instance_types: dict[str, bool]  # asked-about name -> exists
    region_zone_errors: dict[tuple[str | None, str | None], str | None]
    # Why the built-in catalog answered (None: SkyPilot's did); "{clouds}" stands for the cloud names.
    builtin_because: str | None = None
    known_instance_types: tuple[str, ...] = ()  # names to suggest for a misspelt one
    # The GPUs each asked-about instance type carries ({} none); absent where the catalog cannot say
    # (a name it does not list, or GCP's n1, which takes GPUs attached to it).
    instance_gpus: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class _Queries:
    instance_types: set[str] = field(default_factory=set)
    region_zones: set[tuple[str | None, str | None]] = field(default_factory=set)


@dataclass(frozen=True)
class DroppedChoice:
    """An accelerator choice no candidate cloud sells, left out of a job that has other choices."""

    request: AcceleratorRequest
    error: SpecError  # the refusal, when no choice is left
    reason: str  # why it is dropped, in a few words

    def warning(self, keeps: str) -> str:
        where = (self.error.source or "job file") + (f":{self.error.line}" if self.error.line is not None else "")
        text = (f"{where}: {self.error.field}: {self.request.name!r} dropped from the accelerator choices: "
                f"{self.reason}; the job keeps {keeps}")
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)  # a name may hold anything
        return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 3] + "..."


def check_catalog(alternatives: list[ResourceAlternative], allowed_clouds: tuple[str, ...], doc: LoadedYaml,
                  source: str, *, offline: bool = False, timeout: float = CATALOG_TIMEOUT_SECONDS,
                  others_left: bool = False) -> list[DroppedChoice]:
    """The accelerator choices to drop; ``SpecError`` when no choice is left, or on a name no
    catalog knows that is not an accelerator choice (an instance type, a region).

    ``allowed_clouds`` are the ``broker.clouds`` (empty: any); they narrow where an alternative
    without its own cloud may run. ``offline`` skips SkyPilot's catalog altogether. ``others_left``:
    the job has choices besides ``alternatives`` (the ones a market quotes), so none is refused.
    """
    candidates = _candidate_clouds(allowed_clouds)
    queries: dict[str, _Queries] = {}
    for alt in alternatives:
        for cloud in _clouds_for(alt, candidates):
            q = queries.setdefault(cloud, _Queries())
            if alt.instance_type:
                q.instance_types.add(alt.instance_type)
            if alt.cloud and (alt.region or alt.zone):
                q.region_zones.add((alt.region, alt.zone))
    if not queries:
        return []
    if offline:
        facts = _builtin_facts(queries, "offline validation")
    elif allowed_clouds and set(allowed_clouds) == {"local"}:
        facts = _builtin_facts(queries, "the job may only run on the local backend")
    else:
        facts = _skypilot_facts(queries, timeout)
    # A count no node offers rules out that choice only, and an accelerator the clouds do not sell
    # (L40 in {L4, L40, A10G}: sold on Kubernetes and neoclouds) is dropped from the choices: like
    # SkyPilot, the job stands while one of its choices can be bought. With none left, the first
    # unknown name is the refusal (most likely a typo), else the first count no node offers.
    unknown: list[DroppedChoice] = []
    unavailable: list[SpecError] = []
    choices = 0
    for alt in alternatives:
        not_sold, problems = _check_alternative(alt, [facts[c] for c in _clouds_for(alt, candidates)], doc, source)
        unknown += not_sold
        unavailable += problems
        choices += max(1, len(alt.accelerators))
    if others_left:
        return unknown
    if unknown and len(unknown) + len(unavailable) >= choices:
        raise unknown[0].error
    if unavailable and len(unknown) + len(unavailable) >= choices:
        raise unavailable[0]
    return unknown


def _candidate_clouds(allowed: tuple[str, ...]) -> tuple[str, ...]:
    named = tuple(c for c in allowed if c in PUBLIC_CLOUDS)
    return named or PUBLIC_CLOUDS


def _clouds_for(alt: ResourceAlternative, candidates: tuple[str, ...]) -> tuple[str, ...]:
    if alt.cloud is None:
        return candidates
    # Other SkyPilot clouds (Lambda, Kubernetes, ...) have no built-in counterpart: SkyPilot judges them at launch.
    return (alt.cloud,) if alt.cloud in PUBLIC_CLOUDS else ()


def _check_alternative(alt: ResourceAlternative, facts: list[CloudFacts], doc: LoadedYaml,
                       source: str) -> tuple[list[DroppedChoice], list[SpecError]]:
    """Raise on an instance type or region no catalog knows; return the accelerators no catalog
    knows, and the choices whose count no node offers."""
    if not facts:
        return [], []
    unknown: list[DroppedChoice] = []
    unavailable: list[SpecError] = []
    where = facts[0].cloud if len(facts) == 1 else "any of " + ", ".join(f.cloud for f in facts)
    note = _note(facts)
    if alt.cloud is not None:
        problem = facts[0].region_zone_errors.get((alt.region, alt.zone))
        if problem:
            path = _key_path(alt, "infra", doc) or _key_path(alt, "zone" if alt.zone else "region", doc)
            raise _error(f"SkyPilot: {problem}", path or alt.path, doc, source)
    if alt.instance_type and not any(f.instance_types.get(alt.instance_type) for f in facts):
        path = _key_path(alt, "instance_type", doc) or alt.path
        known = sorted({name for f in facts for name in f.known_instance_types})
        close = difflib.get_close_matches(alt.instance_type, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _error(f"unknown instance type {alt.instance_type!r} for {where}{hint}{note}", path, doc, source)
    if alt.instance_type and alt.accelerators:
        _check_instance_carries(alt, facts, doc, source, note)
    for request in alt.accelerators:
        offered: dict[str, set[int]] = {}
        wanted = _alias(request.name).lower()
        for f in facts:
            for name, counts in f.accelerators.items():
                if name.lower() == wanted:
                    offered.setdefault(name, set()).update(counts)
        if not offered:
            known = sorted({name for f in facts for name in f.accelerators})
            by_upper = {k.upper(): k for k in known}
            close = difflib.get_close_matches(request.name.upper(), list(by_upper), n=1, cutoff=0.5)
            hint = f" (did you mean {by_upper[close[0]]!r}?)" if close else ""
            if any(f.builtin_because for f in facts):
                hint += f"; known: {', '.join(known)}"
            close_hint = f" (did you mean {by_upper[close[0]]!r}?)" if close else ""
            unknown.append(DroppedChoice(request, _error(f"unknown accelerator {request.name!r} on {where}{hint}{note}",
                                                         request.path, doc, source),
                                         f"not sold on {where}{close_hint}{note}"))
            continue
        name, counts = next(iter(offered.items()))
        if counts and request.fraction is None and request.count not in counts:
            offered_text = ", ".join(str(c) for c in sorted(counts))
            unavailable.append(_error(f"{name}:{request.count} is not offered on {where}: a node has {offered_text} "
                                      f"{name}{note}", request.path, doc, source))
    return unknown, unavailable


def _check_instance_carries(alt: ResourceAlternative, facts: list[CloudFacts], doc: LoadedYaml, source: str,
                            note: str) -> None:
    """Refuse an instance type that carries none of the named accelerators at the named count per
    node, as SkyPilot does ("Infeasible resource demands"); a share of one GPU (A100:0.5) fits a type
    with at least one. A cloud whose catalog cannot say what the type carries lets the pair pass."""
    assert alt.instance_type is not None
    carried: list[dict[str, float]] = []
    for f in facts:
        if not f.instance_types.get(alt.instance_type):
            continue
        gpus = f.instance_gpus.get(alt.instance_type)
        if gpus is None:
            return
        carried.append(gpus)
    for gpus in carried:
        by_name = {_alias(name).lower(): count for name, count in gpus.items()}
        for request in alt.accelerators:
            count = by_name.get(_alias(request.name).lower())
            if count is not None and (count == request.count or (request.fraction is not None and count >= 1)):
                return
    if not carried:
        return
    has = ", ".join(sorted({f"{n}:{c:g}" for g in carried for n, c in g.items()})) or "no GPUs"
    wanted = ", ".join(f"{r.name}:{r.count:g}" for r in alt.accelerators)
    path = _key_path(alt, "instance_type", doc) or alt.path
    raise _error(f"instance type {alt.instance_type!r} carries {has} per node, not the accelerators asked for "
                 f"({wanted}): name the matching instance type or leave it out{note}", path, doc, source)


def _alias(name: str) -> str:
    from providers.catalog import ALIASES

    return next((canonical for alias, canonical in ALIASES.items() if alias.lower() == name.lower()), name)


def _note(facts: list[CloudFacts]) -> str:
    clouds_by_reason: dict[str, list[str]] = {}
    for f in facts:
        if f.builtin_because:
            clouds_by_reason.setdefault(f.builtin_because, []).append(f.cloud)
    reasons = [reason.format(clouds=", ".join(clouds)) for reason, clouds in clouds_by_reason.items()]
    return f" (checked against the broker's built-in catalog: {'; '.join(reasons)})" if reasons else ""


def _key_path(alt: ResourceAlternative, key: str, doc: LoadedYaml) -> Path | None:
    for path in ((*alt.path, key), ("resources", key)):
        if path in doc.lines:
            return path
    return None


def _error(message: str, path: Path, doc: LoadedYaml, source: str) -> SpecError:
    return SpecError(message, field=format_path(path), line=doc.line_of(path), source=source)


def _marker(cloud: str) -> pathlib.Path:
    return pathlib.Path(tempfile.gettempdir()) / f"broker-sky-catalog-unreachable-{os.getuid()}-{cloud}"


def recently_unreachable(cloud: str) -> bool:
    """True while an earlier lookup of ``cloud``'s catalog failed less than UNREACHABLE_FOR_SECONDS ago."""
    if _unreachable_until.get(cloud, 0.0) > time.monotonic():
        return True
    try:
        return time.time() - _marker(cloud).stat().st_mtime < UNREACHABLE_FOR_SECONDS
    except OSError:
        return False


def _remember(cloud: str, reachable: bool) -> None:
    if reachable:
        _unreachable_until.pop(cloud, None)
        with contextlib.suppress(OSError):
            _marker(cloud).unlink()
        return
    _unreachable_until[cloud] = time.monotonic() + UNREACHABLE_FOR_SECONDS
    with contextlib.suppress(OSError):
        _marker(cloud).touch()


def _skypilot_facts(queries: dict[str, _Queries], timeout: float) -> dict[str, CloudFacts]:
    results: dict[str, CloudFacts | BaseException] = {}

    def look_up(cloud: str) -> None:
        try:
            results[cloud] = _ask_skypilot(cloud, queries[cloud])
            _remember(cloud, True)  # also when it answers after the caller stopped waiting
        except BaseException as exc:  # any failure to load a catalog means: use the built-in one
            results[cloud] = exc
            _remember(cloud, False)

    skipped = [c for c in queries if recently_unreachable(c)]
    for cloud in skipped:
        results[cloud] = TimeoutError("unreachable recently")
    deadline = time.monotonic() + timeout
    threads = [threading.Thread(target=look_up, args=(c,), name=f"sky-catalog-{c}", daemon=True)
               for c in queries if c not in skipped]
    with _quiet_skypilot(threads):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    facts: dict[str, CloudFacts] = {}
    for cloud in queries:
        outcome = results.get(cloud)
        if isinstance(outcome, CloudFacts):
            facts[cloud] = outcome
        else:
            if outcome is None:
                _remember(cloud, False)  # still trying in the background; do not wait for it again
            reason = (f"no answer from SkyPilot's catalog for {{clouds}} within {timeout:g}s" if outcome is None
                      else "SkyPilot's catalog for {clouds} could not be fetched recently" if cloud in skipped
                      else f"SkyPilot's catalog for {{clouds}} could not be fetched ({type(outcome).__name__})")
            facts[cloud] = _builtin_facts({cloud: queries[cloud]}, reason)[cloud]
    return facts


def _ask_skypilot(cloud: str, queries: _Queries) -> CloudFacts:
    from sky import catalog as sky_catalog
    from sky.utils import registry

    listing = sky_catalog.list_accelerators(gpus_only=False, clouds=cloud, case_sensitive=False, all_regions=True,
                                            require_price=False)
    accelerators = {name: {int(i.accelerator_count) for i in infos if float(i.accelerator_count).is_integer()}
                    for name, infos in listing.items()}
    instance_types = {name: bool(sky_catalog.instance_type_exists(name, clouds=cloud))
                      for name in queries.instance_types}
    instance_gpus: dict[str, dict[str, float]] = {}
    for name, exists in instance_types.items():
        gpus = sky_catalog.get_accelerators_from_instance_type(name, clouds=cloud) if exists else None
        if gpus is not None or (exists and cloud != "gcp"):  # GCP's None: GPUs are attached (n1)
            instance_gpus[name] = {str(k): float(v) for k, v in (gpus or {}).items()}
    region_zone_errors: dict[tuple[str | None, str | None], str | None] = {}
    cloud_obj = registry.CLOUD_REGISTRY.from_str(cloud)
    assert cloud_obj is not None, cloud
    for region, zone in queries.region_zones:
        try:
            cloud_obj.validate_region_zone(region, zone)
            region_zone_errors[(region, zone)] = None
        except ValueError as exc:
            region_zone_errors[(region, zone)] = str(exc).strip()
    return CloudFacts(cloud, accelerators, instance_types, region_zone_errors, instance_gpus=instance_gpus)


def _builtin_facts(queries: dict[str, _Queries], reason: str) -> dict[str, CloudFacts]:
    from providers import catalog

    facts: dict[str, CloudFacts] = {}
    for cloud, q in queries.items():
        accelerators: dict[str, set[int]] = {}
        attached: set[str] = set()
        for t in catalog.instance_types(cloud=cloud):
            accelerators.setdefault(t.accelerator, set()).add(t.gpus)
            if t.attached:
                attached.add(t.accelerator)
        for name in attached:  # GPUs attached to a general-purpose machine (GCP n1) come in any count
            accelerators[name] = set()
        # Sold on this cloud per SkyPilot's list, node shapes not in the built-in rows: any count passes.
        for name, clouds in catalog.ACCELERATOR_CLOUDS.items():
            if cloud in clouds:
                accelerators.setdefault(name, set())
        # The built-in rows hold GPU types and common CPU families: another name spelt the cloud's way
        # passes (SkyPilot judges it at launch), one that is not is refused with the nearest known name.
        instance_types = {name: catalog.find_any(name, cloud) is not None or catalog.spelt_as_instance_type(name, cloud)
                          for name in q.instance_types}
        known = tuple(t.name for t in (*catalog.GPU_INSTANCE_TYPES, *catalog.CPU_INSTANCE_TYPES) if t.cloud == cloud)
        shapes = {name: catalog.find_any(name, cloud) for name in q.instance_types}
        instance_gpus = {name: ({shape.accelerator: float(shape.gpus)} if shape.gpus > 0 else {})
                         for name, shape in shapes.items() if shape is not None and not shape.attached}
        # The built-in catalog has no region list: regions are left for SkyPilot to judge at launch.
        facts[cloud] = CloudFacts(cloud, accelerators, instance_types, dict.fromkeys(q.region_zones),
                                  builtin_because=reason, known_instance_types=known, instance_gpus=instance_gpus)
    return facts


@contextlib.contextmanager
def _quiet_skypilot(threads: list[threading.Thread]) -> Iterator[None]:
    """SkyPilot logs catalog downloads and their failures; the job file's verdict is the only output
    wanted. A lookup still running when the caller stops waiting stays quiet too."""
    from sky import sky_logging

    sky_logger = logging.getLogger("sky")
    with sky_logging.silent():
        previous = sky_logger.level
        sky_logger.setLevel(logging.CRITICAL + 1)
        try:
            yield
        finally:
            if not any(thread.is_alive() for thread in threads):
                sky_logger.setLevel(previous)
