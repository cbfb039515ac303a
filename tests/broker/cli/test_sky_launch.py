"""A job on the SkyPilot backend is judged against what the clouds quote: any GPU instance type the
price book has seen is accepted, whatever the built-in catalog knows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.cli.sky_launch import read_job
from broker.config.settings import ConfigError, load_settings
from broker.market.book import PriceBook
from broker.spec.errors import SpecError
from broker.spec.job import load_job_spec
from broker.store import open_store
from providers.base import SpotQuote

JOB = "name: g\nnum_nodes: 2\nresources:\n  accelerators: MI355X:8\nrun: python train.py\n"


def test_an_instance_type_only_the_price_book_quotes_is_accepted(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    with pytest.raises(SpecError, match="MI355X"):  # the built-in catalog alone refuses it
        load_job_spec(job, offline=True)
    store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    try:
        now = datetime.now(UTC)
        PriceBook(store).record("azure", [SpotQuote("azure", "eastus", "eastus-1", "Standard_ND96isr_MI355X_v6",
                                                    "MI355X", 8, 21.0, 42.0, now)], at=now)
        spec = read_job(job, PriceBook(store))
    finally:
        store.dispose()
    assert (spec.num_nodes, spec.accelerator, spec.gpus_per_node) == (2, "MI355X", 8)


@pytest.mark.parametrize(("name", "value", "field"), [
    ("price_max_age_seconds", "-1", "price_max_age_seconds"),
    ("price_max_age_seconds", "1e400", "price_max_age_seconds"),
    ("price_stale_seconds", "soon", "price_stale_seconds"),
    ("skypilot_sdk", "os:system; rm -rf /", "skypilot_sdk"),
    ("skypilot_sdk", "a\x00b:c", "skypilot_sdk"),
    ("skypilot_sdk", "m" * 5000 + ":x", "skypilot_sdk"),
])
def test_bad_settings_are_refused_naming_the_field(broker_home: Path, name: str, value: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_settings(**{name: value})
