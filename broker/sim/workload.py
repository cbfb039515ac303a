"""A cluster job trace: ``job_id,num_gpus,submit_time,duration,model`` (Philly-style, seconds)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from broker.errors import UserError

COLUMNS = ("job_id", "num_gpus", "submit_time", "duration", "model")


class WorkloadError(UserError, ValueError):
    """A workload file that cannot be read; the message names the file, row and field."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    gpus: int
    submit_s: float
    duration_s: float  # runtime on the job's ideal placement
    model: str


def _number(path: Path, row: int, field: str, text: str, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise WorkloadError(f"{path}: row {row}: {field} must be {kind}, got {text!r}") from None
    return value


def read_workload(path: Path) -> list[TraceJob]:
    """Every job of the trace, in submit order; raises WorkloadError naming the first bad field."""
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc.strerror or exc}") from None
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}")
        for row, rec in enumerate(reader, start=2):
            job_id = (rec["job_id"] or "").strip()
            if not job_id:
                raise WorkloadError(f"{path}: row {row}: job_id is empty")
            if job_id in seen:
                raise WorkloadError(f"{path}: row {row}: job_id {job_id!r} appears twice")
            seen.add(job_id)
            gpus = int(_number(path, row, "num_gpus", rec["num_gpus"], integer=True))
            if gpus < 1:
                raise WorkloadError(f"{path}: row {row}: num_gpus must be at least 1, got {gpus}")
            submit = _number(path, row, "submit_time", rec["submit_time"], integer=False)
            duration = _number(path, row, "duration", rec["duration"], integer=False)
            if submit < 0:
                raise WorkloadError(f"{path}: row {row}: submit_time must be >= 0, got {submit}")
            if duration <= 0:
                raise WorkloadError(f"{path}: row {row}: duration must be > 0, got {duration}")
            model = (rec["model"] or "").strip()
            if not model:
                raise WorkloadError(f"{path}: row {row}: model is empty")
            jobs.append(TraceJob(job_id, gpus, submit, duration, model))
    if not jobs:
        raise WorkloadError(f"{path}: no jobs")
    jobs.sort(key=lambda j: j.submit_s)
    return jobs
