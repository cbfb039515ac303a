from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.market.book import PriceBook
from broker.market.polling import poll_prices
from broker.store import open_store
from providers.aws import AwsPriceSource
from providers.azure import AzurePriceSource
from providers.fetching import Backoff
from providers.gcp import GcpPriceSource
from tests.fakeclouds.market import FakeClouds, fake_clouds

os.environ.setdefault("NO_GCE_CHECK", "true")  # not a GCE VM: skip google-auth's metadata probe

FAST = Backoff(attempts=3, base_seconds=0.01, max_seconds=0.02)
# The call each cloud's poll cannot do without.
ESSENTIAL = {"aws": "DescribeSpotPriceHistory", "gcp": "skus", "azure": "retail"}


class StaticToken:
    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("t", int(time.time()) + 3600)


@pytest.fixture(scope="module")
def servers() -> Iterator[FakeClouds]:
    with fake_clouds() as clouds:
        yield clouds


@pytest.fixture
def sources(servers: FakeClouds, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    from google.auth.credentials import AnonymousCredentials

    env = servers.environment()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield {
        "aws": AwsPriceSource(regions=["us-east-1"], ec2_endpoint=env["AWS_ENDPOINT_URL_EC2"],
                              pricing_endpoint=env["AWS_ENDPOINT_URL_PRICING"], backoff=FAST),
        "gcp": GcpPriceSource(project="p", regions=["us-central1"], compute_endpoint=env["BROKER_GCP_COMPUTE_ENDPOINT"],
                              billing_endpoint=env["BROKER_GCP_BILLING_ENDPOINT"], credentials=AnonymousCredentials(),
                              backoff=FAST),
        "azure": AzurePriceSource(regions=["eastus"], prices_url=env["BROKER_AZURE_PRICES_URL"],
                                  rm_endpoint=env["BROKER_AZURE_RM_ENDPOINT"], subscription_id="s",
                                  credential=StaticToken(), backoff=FAST),
    }
    for server in (servers.aws, servers.gcp, servers.azure):
        server.clear_faults()


@pytest.fixture
def book(tmp_path: Path) -> Iterator[PriceBook]:
    store = open_store(f"sqlite:///{tmp_path / 'book.db'}")
    yield PriceBook(store)
    store.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["aws", "gcp", "azure"])
def test_a_cloud_failing_for_good_goes_stale_while_the_others_update(
        failing: str, servers: FakeClouds, sources: dict[str, Any], book: PriceBook) -> None:
    first = poll_prices(book, sources)
    assert [(p.cloud, p.status) for p in first] == [("aws", "ok"), ("gcp", "ok"), ("azure", "ok")]
    before = {q.key: q.observed_at for q in book.latest()}

    getattr(servers, failing).fail(ESSENTIAL[failing], 500, times=None)
    second = {p.cloud: p for p in poll_prices(book, sources)}
    assert second[failing].status == "failed"
    assert second[failing].message.endswith(f"kept {first[['aws', 'gcp', 'azure'].index(failing)].quotes} "
                                            "quotes, marked stale")
    for quote in book.latest():
        if quote.cloud == failing:
            assert quote.stale and quote.observed_at == before[quote.key]
        else:
            assert not quote.stale and quote.observed_at > before[quote.key]


@pytest.mark.slow
@pytest.mark.parametrize(("cloud", "status"), [("aws", 503), ("gcp", 429), ("azure", 429), ("aws", 500),
                                               ("gcp", 500), ("azure", 500)])
def test_throttling_and_server_errors_are_ridden_out(cloud: str, status: int, servers: FakeClouds,
                                                     sources: dict[str, Any], book: PriceBook) -> None:
    server = getattr(servers, cloud)
    server.fail(ESSENTIAL[cloud], status, times=FAST.attempts - 1)
    (poll,) = poll_prices(book, {cloud: sources[cloud]})
    assert poll.status == "ok" and poll.quotes > 0
    assert {q.cloud for q in book.latest()} == {cloud}
