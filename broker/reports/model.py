"""The built report as plain data: what every renderer reads and what a delivery stores as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from broker.model import Usage

# Every usage but RUNNING is a GPU-minute paid for without progress, in the order the report shows them.
IDLE_CAUSES: tuple[str, ...] = (
    Usage.PROVISIONING.value,
    Usage.RESTARTING.value,
    Usage.WAITING.value,
    Usage.UNALLOCATED.value,
    Usage.STRANDED.value,
    Usage.FINISHED.value,
    Usage.QUEUE_DRAIN.value,
    "held_idle",
)
# The ledger's held-idle usages (broker/engine/gpu_attribution.py), summed as one cause and kept by part.
HELD_IDLE = "held_idle"
HELD_IDLE_PARTS: dict[str, str] = {
    Usage.HELD_IDLE_STARTUP.value: "startup",
    Usage.HELD_IDLE_CHECKPOINT.value: "checkpoint",
    Usage.HELD_IDLE_STALLED.value: "stalled",
}
CAUSE_LABELS: dict[str, str] = {
    "provisioning": "provisioning",
    "restarting": "checkpoint & restart",
    "waiting": "waiting for a job",
    "unallocated": "unallocated (fragmentation)",
    "stranded": "stranded GPU fractions",
    "finished": "held by finished jobs",
    "queue_drain": "queue drain (between jobs)",
    "held_idle": "held idle by running jobs (measured)",
}
DIMENSIONS: tuple[str, ...] = ("job", "team", "cloud", "region", "gpu")
IDLE_KEY = "(idle)"  # the job grouping's key for GPUs no job held


@dataclass
class Figures:
    """Sums over a set of ledger rows (and the jobs they belong to)."""

    spend: float = 0.0
    on_demand: float = 0.0
    gpu_hours: float = 0.0
    useful_gpu_hours: float = 0.0
    spot_gpu_hours: float = 0.0
    idle_gpu_hours: dict[str, float] = field(default_factory=dict)
    idle_cost: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    migrations: int = 0
    work_lost_s: float = 0.0
    jobs: int = 0
    shared_gpu_hours: float = 0.0  # held by jobs holding a fraction of a GPU (A100:0.5)
    # GPU-hours running jobs held while their GPUs were measured idle, by part (startup, checkpoint, stalled).
    held_idle_parts: dict[str, float] = field(default_factory=dict)
    held_idle_parts_cost: dict[str, float] = field(default_factory=dict)
    measured_gpu_hours: float = 0.0  # GPU-hours of running jobs whose GPUs' utilisation was measured

    @property
    def unmeasured_gpu_hours(self) -> float:
        """Running jobs' GPU-hours no GPU figure covers (a node without NVML): counted useful, as before."""
        held = self.useful_gpu_hours + self.idle_gpu_hours.get(HELD_IDLE, 0.0)
        return max(held - self.measured_gpu_hours, 0.0)

    @property
    def saving(self) -> float:
        return self.on_demand - self.spend

    @property
    def saving_pct(self) -> float:
        return 100.0 * self.saving / self.on_demand if self.on_demand else 0.0

    @property
    def spot_share(self) -> float:
        return self.spot_gpu_hours / self.gpu_hours if self.gpu_hours else 0.0

    @property
    def idle_total_gpu_hours(self) -> float:
        return sum(self.idle_gpu_hours.values())

    @property
    def stranded_gpu_hours(self) -> float:
        """What fractions left unused of the GPUs they shared: idle, stranded by fragmentation."""
        return self.idle_gpu_hours.get(Usage.STRANDED.value, 0.0)

    @property
    def restart_gpu_hours(self) -> float:
        return self.idle_gpu_hours.get(Usage.RESTARTING.value, 0.0)

    @property
    def restart_cost(self) -> float:
        return self.idle_cost.get(Usage.RESTARTING.value, 0.0)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(saving=self.saving, saving_pct=self.saving_pct, spot_share=self.spot_share,
                    idle_total_gpu_hours=self.idle_total_gpu_hours, restart_gpu_hours=self.restart_gpu_hours,
                    restart_cost=self.restart_cost, work_lost_hours=self.work_lost_s / 3600,
                    stranded_gpu_hours=self.stranded_gpu_hours, unmeasured_gpu_hours=self.unmeasured_gpu_hours)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Figures:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Group:
    """One row of a grouping: a job, a team, a cloud, a region or a GPU type."""

    key: str
    label: str
    figures: Figures

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, **self.figures.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Group:
        return cls(data["key"], data["label"], Figures.from_dict(data))


@dataclass
class Waste:
    """A place GPU money went without progress, with what to do about it."""

    cause: str
    where: str
    gpu_hours: float
    cost: float
    suggestion: str


@dataclass
class DailyPoint:
    day: str  # YYYY-MM-DD, UTC
    cloud: str
    spend: float
    on_demand: float


@dataclass
class Report:
    start: datetime
    end: datetime
    team: str | None
    generated_at: datetime
    totals: Figures
    groups: dict[str, list[Group]]
    wastes: list[Waste]
    daily: list[DailyPoint]
    # Per finished, measured job: what its GPUs say it needed (broker/reports/rightsizing.py), as data.
    right_sizing: list[dict[str, Any]] = field(default_factory=list)

    @property
    def title(self) -> str:
        scope = f"team {self.team}" if self.team else "all teams"
        return f"GPU spend {self.start:%Y-%m-%d %H:%M} to {self.end:%Y-%m-%d %H:%M} UTC, {scope}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "team": self.team,
            "generated_at": self.generated_at.isoformat(),
            "totals": self.totals.to_dict(),
            "groups": {name: [g.to_dict() for g in rows] for name, rows in self.groups.items()},
            "wastes": [asdict(w) for w in self.wastes],
            "daily": [asdict(d) for d in self.daily],
            "right_sizing": self.right_sizing,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        return cls(
            start=datetime.fromisoformat(data["start"]),
            end=datetime.fromisoformat(data["end"]),
            team=data.get("team"),
            generated_at=datetime.fromisoformat(data["generated_at"]),
            totals=Figures.from_dict(data["totals"]),
            groups={name: [Group.from_dict(g) for g in rows] for name, rows in data["groups"].items()},
            wastes=[Waste(**w) for w in data["wastes"]],
            daily=[DailyPoint(**d) for d in data["daily"]],
            right_sizing=list(data.get("right_sizing", [])),
        )
