"""The SkyPilot backend put together: real clusters, the wall clock, the price book as the market.

``broker.runtime.assemble`` builds a ``SkyPilotBackend`` for ``backend: skypilot``. Its notice API
listens on ``api_host:api_port``; node agents report to ``public_url`` (it must reach this machine
from the clouds), and, with ``sqs_queue_url`` set, an SQS listener feeds EventBridge's EC2 spot
warnings into the same notice table.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from broker.backends.agent_wheel import build_agent_wheel
from broker.backends.base import ClusterInfo
from broker.backends.skypilot.provisioner import SkyPilotOptions, SkyPilotProvisioner
from broker.backends.skypilot.task import AgentPackage, cluster_task, sky_cluster_name
from broker.clock import WallClock
from broker.config.settings import Settings
from broker.market.book import PriceBook
from broker.market.price_market import PriceBookMarket
from broker.market.sky_catalog import SkyCatalogMarket
from broker.model import ACTIVE_STATES, LIVE_CLUSTER_STATES
from broker.spec.job import JobSpec, job_spec_from_data
from broker.store import Store
from broker.store.tables import ClusterRow, JobRow

log = logging.getLogger("broker.runtime")


@dataclass
class SkyPilotBackend:
    """The SkyPilot backend's parts: the wall clock, the price book's market and SkyPilot's provisioner."""

    clock: WallClock
    market: PriceBookMarket
    provisioner: SkyPilotProvisioner
    world: None = None  # no local replay

    def offered(self) -> None:
        return None  # SkyPilot's catalog: an accelerator no cloud offers was refused when the job file was read

    def api_address(self, settings: Settings) -> tuple[str, int]:
        return settings.api_host, settings.api_port

    def agents_url(self, settings: Settings, api_url: str) -> str:
        return settings.public_url or api_url

    def reconcile(self, store: Store, check: Callable[[], None] | None = None) -> list[str]:
        return reconcile_sky(store, self.provisioner, check)

    def notice_listener(self, store: Store, settings: Settings) -> Any:
        """EventBridge's spot warnings through SQS when ``sqs_queue_url`` is set, started; else None."""
        if not settings.sqs_queue_url:
            return None
        from broker.notices.sqs import SqsNoticeListener

        listener = SqsNoticeListener.from_settings(store, self.clock, settings)
        listener.start()
        return listener

    def recover(self, store: Store) -> list[str]:
        return []  # its agents report to the address ``broker serve`` gives them, which outlives any engine

    def beside_engine(self, store: Store, settings: Settings) -> list[Any]:
        """An embedded engine's company: one reconcile with ``sky status``, and the SQS listener."""
        threading.Thread(target=self.reconcile, args=(store,), name="sky-reconcile", daemon=True).start()
        listener = self.notice_listener(store, settings)
        return [listener] if listener is not None else []


def skypilot_backend(settings: Settings, store: Store, sdk: Any = None, catalog: Any = None) -> SkyPilotBackend:
    """The market is the price book, with SkyPilot's catalog only for offers it never quoted; ``sdk``
    and ``catalog`` stand in for SkyPilot's own in tests (or the ``skypilot_sdk`` setting)."""
    if sdk is None and settings.skypilot_sdk is not None:
        from broker.service.hooks import find

        sdk = find(settings.skypilot_sdk, "skypilot_sdk")
    market = PriceBookMarket(PriceBook(store), SkyCatalogMarket(lambda: (), catalog=catalog),
                             settings.price_stale_seconds, wanted=lambda: active_accelerators(store))
    provisioner = SkyPilotProvisioner(settings.home, store_specs(store), skypilot_options(settings), sdk=sdk)
    return SkyPilotBackend(WallClock(), market, provisioner)


def store_specs(store: Store) -> Callable[[str], JobSpec | None]:
    """cluster id -> the spec of the job it was launched for (read from the store, then cached)."""
    cache: dict[str, JobSpec] = {}

    def lookup(cluster_id: str) -> JobSpec | None:
        if cluster_id not in cache:
            with store.transaction() as s:
                job = s.scalar(select(JobRow).join(ClusterRow, ClusterRow.job_id == JobRow.id)
                               .where(ClusterRow.id == cluster_id))
                if job is None:
                    return None
                cache[cluster_id] = job_spec_from_data(job.spec, source=job.spec_path or job.name, offline=True)
        return cache[cluster_id]

    return lookup


def active_accelerators(store: Store) -> set[str]:
    with store.transaction() as s:
        return {a for a in s.scalars(select(JobRow.accelerator).where(JobRow.state.in_(ACTIVE_STATES))) if a}


def skypilot_options(settings: Settings) -> SkyPilotOptions:
    return SkyPilotOptions(prefix=settings.skypilot_prefix, launch_timeout_s=settings.skypilot_launch_timeout,
                           refresh_s=settings.skypilot_refresh_seconds,
                           idle_minutes_to_autostop=settings.skypilot_autostop_minutes)


def reconcile_sky(store: Store, provisioner: SkyPilotProvisioner, check: Callable[[], None] | None = None) -> list[str]:
    """Tear down SkyPilot clusters of this broker that the store does not hold live; returns their ids.
    ``check`` runs before any teardown (a leader's fence)."""
    with store.transaction() as s:
        known = set(s.scalars(select(ClusterRow.id).where(ClusterRow.state.in_(LIVE_CLUSTER_STATES))))
    if check is not None:
        check()
    try:
        strays = provisioner.reconcile(known)
    except Exception as exc:  # the engine works without it; the next pass tries again
        log.warning("could not reconcile with sky status: %s", exc)
        return []
    if strays:
        log.warning("tearing down %d stray cluster(s): %s", len(strays), ", ".join(strays))
    return strays


def dryrun_task(spec: JobSpec, cluster: ClusterInfo, settings: Settings) -> tuple[str, dict[str, Any]]:
    """The SkyPilot cluster name and the task an offer would be launched with."""
    agent = AgentPackage(build_agent_wheel(settings.home / "agent"))
    return sky_cluster_name(settings.skypilot_prefix, cluster.id), cluster_task(spec, cluster, agent)
