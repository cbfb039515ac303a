"""The broker on the SkyPilot backend: real clusters, the wall clock, SkyPilot's catalog as the market.

Same shape as ``EmbeddedBroker`` (store, clock, market, provisioner, ``start``/``close``), so the
job commands drive either. The notice API listens on ``api_host:api_port``; node agents report to
``public_url`` (it must reach this machine from the clouds), and, with ``sqs_queue_url`` set, an
SQS listener feeds EventBridge's EC2 spot warnings into the same notice table.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from sqlalchemy import select

from broker.api.app import BackgroundServer, create_app
from broker.clock import WallClock
from broker.config import Settings
from broker.engine import Engine, engine_options
from broker.model import ACTIVE_STATES, LIVE_CLUSTER_STATES
from broker.provision.agent_wheel import build_agent_wheel
from broker.provision.base import ClusterInfo
from broker.provision.sky_market import SkyCatalogMarket
from broker.provision.sky_task import AgentPackage, cluster_task, sky_cluster_name
from broker.provision.skypilot import SkyPilotOptions, SkyPilotProvisioner
from broker.spec import JobSpec, job_spec_from_data
from broker.store import Store, open_store
from broker.store.tables import ClusterRow, JobRow
from broker.tokens import SharedAgentTokens

log = logging.getLogger("broker.runtime")


def store_specs(store: Store) -> Any:
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


class SkyPilotBroker:
    def __init__(self, settings: Settings, store: Store | None = None, sdk: Any = None, catalog: Any = None) -> None:
        self.settings = settings
        self.home = settings.home
        self.store = store or open_store(settings.database_url)
        self.clock = WallClock()
        self.market = SkyCatalogMarket(lambda: active_accelerators(self.store), catalog=catalog)
        self.provisioner = SkyPilotProvisioner(self.home, store_specs(self.store), skypilot_options(settings),
                                               sdk=sdk)
        self.tokens = SharedAgentTokens(self.store, self.home)
        self.server: BackgroundServer | None = None
        self.engine: Engine | None = None
        self.listener: Any = None

    def start(self) -> Engine:
        self.server = BackgroundServer(create_app(self.store, self.clock), self.settings.api_host,
                                       self.settings.api_port).start()
        url = self.settings.public_url or self.server.url
        self.engine = Engine(self.store, self.clock, self.market, self.provisioner,
                             engine_options(self.settings, url), tokens=self.tokens)
        threading.Thread(target=self._reconcile, name="sky-reconcile", daemon=True).start()
        if self.settings.sqs_queue_url:
            from broker.notices_sqs import SqsNoticeListener

            self.listener = SqsNoticeListener.from_settings(self.store, self.clock, self.settings)
            self.listener.start()
        return self.engine

    def _reconcile(self) -> None:
        with self.store.transaction() as s:
            known = set(s.scalars(select(ClusterRow.id).where(ClusterRow.state.in_(LIVE_CLUSTER_STATES))))
        try:
            strays = self.provisioner.reconcile(known)
        except Exception as exc:  # the engine works without it; the next start tries again
            log.warning("could not reconcile with sky status: %s", exc)
            return
        if strays:
            log.warning("tearing down %d stray cluster(s): %s", len(strays), ", ".join(strays))

    def close(self) -> None:
        if self.listener is not None:
            self.listener.stop()
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
        self.store.dispose()


def dryrun_task(spec: JobSpec, cluster: ClusterInfo, settings: Settings) -> tuple[str, dict[str, Any]]:
    """The SkyPilot cluster name and the task an offer would be launched with."""
    agent = AgentPackage(build_agent_wheel(settings.home / "agent"))
    return sky_cluster_name(settings.skypilot_prefix, cluster.id), cluster_task(spec, cluster, agent)
