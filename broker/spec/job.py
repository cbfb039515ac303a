"""The job file: a SkyPilot task YAML plus an optional ``broker:`` section.

``load_job_spec(path)`` returns a validated, immutable ``JobSpec`` or raises ``SpecError`` naming
the field, the line and what was expected. The SkyPilot part is judged by SkyPilot itself
(``sky.Task.from_yaml_config`` and its catalog, or the built-in catalog when SkyPilot's cannot be
fetched); the ``broker:`` section by pydantic models in ``broker.spec.broker_section``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from broker.spec import values
from broker.spec.catalog_check import CATALOG_TIMEOUT_SECONDS
from broker.spec.errors import SpecError
from broker.spec.model import (
    PRIORITY_CLASSES,
    AcceleratorChoice,
    BrokerSection,
    CheckpointSpec,
    CloudScope,
    JobSpec,
    MarketOffer,
    Pipeline,
    market_offers,
    sky_task_config,
)
from broker.spec.pipeline import build_pipeline
from broker.spec.task import build_task
from broker.spec.yaml_lines import MAX_FILE_BYTES, LoadedYaml, json_safe, load_yaml_documents

__all__ = [
    "CATALOG_TIMEOUT_SECONDS",
    "PRIORITY_CLASSES",
    "AcceleratorChoice",
    "BrokerSection",
    "CheckpointSpec",
    "CloudScope",
    "JobSpec",
    "MarketOffer",
    "Pipeline",
    "SpecError",
    "job_spec_from_data",
    "load_job_file",
    "load_job_spec",
    "load_pipeline",
    "market_offers",
    "parse_duration",
    "parse_job_file",
    "parse_job_quoted",
    "parse_job_spec",
    "sky_task_config",
]

def parse_duration(value: Any, field: str = "duration") -> timedelta:
    """``90s``, ``30m``, ``1.5h``, ``2d``, ``1w`` or a bare number of seconds."""
    try:
        return values.duration(value)
    except ValueError as exc:
        raise SpecError(str(exc), field) from None


def load_job_spec(path: str | Path, *, offline: bool = False, catalog_timeout: float = CATALOG_TIMEOUT_SECONDS,
                  market: tuple[MarketOffer, ...] | None = None) -> JobSpec:
    """``market``: judge accelerators and instance types against what it offers (a ``--market`` run,
    ``broker simulate``) instead of a catalog: a job the market offers is never refused."""
    path = Path(path)
    return parse_job_spec(read_job_file(path), source=str(path), offline=offline, catalog_timeout=catalog_timeout,
                          market=market)


def load_job_file(path: str | Path, *, offline: bool = False,
                  catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> JobSpec | Pipeline:
    """A one-task job file as a ``JobSpec``, a multi-document one as a ``Pipeline``."""
    path = Path(path)
    return parse_job_file(read_job_file(path), source=str(path), offline=offline, catalog_timeout=catalog_timeout)


def load_pipeline(path: str | Path, *, offline: bool = False,
                  catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> Pipeline:
    loaded = load_job_file(path, offline=offline, catalog_timeout=catalog_timeout)
    if isinstance(loaded, JobSpec):
        return Pipeline(loaded.name, "chain", (loaded,), {}, loaded.source)
    return loaded


def read_job_file(path: Path) -> str:
    """The job file's text, or a SpecError naming the file."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError("no such file", source=str(path)) from None
    except OSError as exc:
        raise SpecError(f"cannot read the job file: {exc}", source=str(path)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(f"the job file is over {MAX_FILE_BYTES:,} bytes; put large scripts in files under workdir",
                        source=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpecError(f"not UTF-8 text (byte {exc.start}): a job file is YAML text", line=line,
                        source=str(path)) from None


def parse_job_spec(text: str, source: str = "job file", *, now: datetime | None = None, offline: bool = False,
                   catalog_timeout: float = CATALOG_TIMEOUT_SECONDS,
                   market: tuple[MarketOffer, ...] | None = None) -> JobSpec:
    """Validate a job file's text.

    ``now`` (default: the current time) is what a deadline must come after. Instance types and
    accelerators are looked up in SkyPilot's catalog, or in the built-in one when SkyPilot's
    cannot be fetched within ``catalog_timeout`` seconds, or always when ``offline``.
    A multi-document file (a pipeline) is validated stage by stage, then refused: only ``broker
    launch`` runs pipelines (``parse_job_file``).
    """
    loaded = parse_job_file(text, source, now=now, offline=offline, catalog_timeout=catalog_timeout, market=market)
    if isinstance(loaded, Pipeline):
        what = "job group" if loaded.kind == "group" else "pipeline"
        names = ", ".join(stage.name for stage in loaded.stages)
        raise SpecError(f"a {what} of {len(loaded.stages)} stages ({names}): its stages are valid, but this takes "
                        f"one task; `broker launch` runs a {what}", source=source)
    return loaded


def parse_job_file(text: str, source: str = "job file", *, now: datetime | None = None, offline: bool = False,
                   catalog_timeout: float = CATALOG_TIMEOUT_SECONDS,
                   market: tuple[MarketOffer, ...] | None = None, skypilot: bool = True) -> JobSpec | Pipeline:
    """``skypilot=False``: judged by SkyPilot's schema (the broker's copy) and the built-in catalog, without
    importing SkyPilot, for a backend that never hands the task to it (``broker.spec.task.build_task``)."""
    documents = load_yaml_documents(text, source)
    when = now or datetime.now(UTC)
    if len(documents) == 1:
        return build_task(documents[0], source, when, offline, catalog_timeout, market=market, skypilot=skypilot)
    return build_pipeline(documents, source, when, offline, catalog_timeout, skypilot=skypilot)


def parse_job_quoted(text: str, source: str, offers: tuple[MarketOffer, ...], *, offline: bool = False,
                     catalog_timeout: float = CATALOG_TIMEOUT_SECONDS) -> JobSpec | Pipeline:
    """A job file judged first by what the clouds quote (``offers``: the price book's): one task asking
    for an instance type or accelerator they quote is accepted, whether or not a catalog knows it.
    Any other, and a pipeline's stages, are judged by the catalogs, which word the refusal."""
    if offers:
        try:
            return parse_job_file(text, source=source, offline=offline, catalog_timeout=catalog_timeout,
                                  market=offers)
        except SpecError:
            pass
    return parse_job_file(text, source=source, offline=offline, catalog_timeout=catalog_timeout)


def job_spec_from_data(data: dict[str, Any], source: str | None = None, *, offline: bool = False,
                       catalog_timeout: float = CATALOG_TIMEOUT_SECONDS, skypilot: bool = True) -> JobSpec:
    """A stored ``to_data()`` back into a ``JobSpec``.

    Validated as on submission, except that a deadline which has passed since is kept; ``skypilot=False``
    without SkyPilot's own checks (``parse_job_file``), for a job they judged when it was submitted.
    """
    return build_task(LoadedYaml(json_safe(data)), source or "stored job", None, offline, catalog_timeout,
                      skypilot=skypilot)


