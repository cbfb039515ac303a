"""The ledger as the report reads it: one fact per cluster, holder, usage and UTC day.

Shared by the report builder and the waste analysis, which both read facts and neither of which
may import the other.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE_KEY = "(idle)"


@dataclass(frozen=True, slots=True)
class Fact:
    """The ledger summed over one cluster, holder, usage and UTC day."""

    cluster_id: str
    holder: str
    job_id: str | None
    team: str
    usage: str
    cloud: str
    region: str
    zone: str
    gpu: str
    spot: bool
    day: str
    gpu_minutes: float
    cost: float
    on_demand: float
    minutes: int

    @property
    def gpu_hours(self) -> float:
        return self.gpu_minutes / 60.0

    def key(self, dimension: str) -> str:
        if dimension == "job":
            return self.job_id or IDLE_KEY
        if dimension == "team":
            return self.team
        if dimension == "cloud":
            return self.cloud
        if dimension == "region":
            return f"{self.cloud}/{self.region}"
        return self.gpu
