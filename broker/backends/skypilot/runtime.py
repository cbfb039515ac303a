"""The broker on the SkyPilot backend: real clusters, the wall clock, the price book as the market.

Same shape as ``EmbeddedBroker`` (store, clock, market, provisioner, ``start``/``close``), so the
job commands drive either. The notice API listens on ``api_host:api_port``; node agents report to
``public_url`` (it must reach this machine from the clouds), and, with ``sqs_queue_url`` set, an
SQS listener feeds EventBridge's EC2 spot warnings into the same notice table.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from broker.api.app import BackgroundServer, create_app
from broker.backends.agent_wheel import build_agent_wheel
from broker.backends.base import ClusterInfo
from broker.backends.skypilot.provisioner import SkyPilotProvisioner
from broker.backends.skypilot.task import AgentPackage, cluster_task, sky_cluster_name
from broker.config.settings import Settings
from broker.engine import Engine
from broker.model import LIVE_CLUSTER_STATES
from broker.spec.job import JobSpec
from broker.store import Store
from broker.store.tables import ClusterRow

if TYPE_CHECKING:
    from broker.runtime import Runtime

log = logging.getLogger("broker.runtime")


class SkyPilotBroker:
    """Built by ``broker.runtime.open_broker`` over the parts ``broker.runtime.assemble`` put together."""

    def __init__(self, runtime: Runtime) -> None:
        assert isinstance(runtime.provisioner, SkyPilotProvisioner)
        self.runtime = runtime
        self.settings = settings = runtime.settings
        self.home = settings.home
        self.store = self.runtime.store
        self.clock = self.runtime.clock
        self.market = self.runtime.market
        self.provisioner = runtime.provisioner
        self.tokens = self.runtime.tokens
        self.server: BackgroundServer | None = None
        self.engine: Engine | None = None
        self.listener: Any = None

    def start(self) -> Engine:
        self.server = BackgroundServer(create_app(self.store, self.clock), self.settings.api_host,
                                       self.settings.api_port).start()
        url = self.settings.public_url or self.server.url
        self.engine = self.runtime.engine(url)
        threading.Thread(target=self._reconcile, name="sky-reconcile", daemon=True).start()
        if self.settings.sqs_queue_url:
            from broker.notices.sqs import SqsNoticeListener

            self.listener = SqsNoticeListener.from_settings(self.store, self.clock, self.settings)
            self.listener.start()
        return self.engine

    def _reconcile(self) -> None:
        reconcile_sky(self.store, self.provisioner)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.stop()
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
        self.store.dispose()


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
