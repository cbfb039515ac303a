"""A cluster job trace: ``job_id,num_gpus,submit_time,duration,model`` (Philly-style, seconds)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from broker.errors import UserError
from providers.bounded import capped_lines

COLUMNS = ("job_id", "num_gpus", "submit_time", "duration", "model")
# The published workloads have about 100 jobs; a cluster's year is well under this.
MAX_JOBS = 1_000_000
MAX_WORKLOAD_CHARS = 256 * 1024 * 1024
MAX_FIELD_CHARS = 200
MAX_GPUS = 100_000
MAX_SECONDS = 10 * 365 * 86400.0  # submit times and durations: ten years


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
        if not math.isfinite(value) or abs(value) > (MAX_GPUS if integer else MAX_SECONDS):
            raise ValueError(text)
    except ValueError:
        kind = f"an integer up to {MAX_GPUS}" if integer else f"a finite number up to {MAX_SECONDS:.0f}"
        raise WorkloadError(f"{path}: row {row}: {field} must be {kind}, got {text[:40]!r}") from None
    return value


def read_workload(path: Path) -> list[TraceJob]:
    """Every job of the trace, in submit order; raises WorkloadError naming the first bad field."""
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc.strerror or exc}") from None
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    row = 1
    try:
        with handle:
            reader = csv.DictReader(capped_lines(handle, str(path), WorkloadError, MAX_WORKLOAD_CHARS))
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}")
            for row, rec in enumerate(reader, start=2):
                _check_row(path, row, rec)
                jobs.append(_job(path, row, rec, seen))
    except csv.Error as exc:
        raise WorkloadError(f"{path}: row {row + 1}: not CSV ({exc})") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: row {row + 1}: not UTF-8 text") from None
    if not jobs:
        raise WorkloadError(f"{path}: no jobs")
    jobs.sort(key=lambda j: j.submit_s)
    return jobs


def _check_row(path: Path, row: int, rec: dict[str, str | None]) -> None:
    if row > MAX_JOBS + 1:
        raise WorkloadError(f"{path}: row {row}: more than {MAX_JOBS} jobs")
    for field in COLUMNS:
        text = rec.get(field) or ""
        if len(text) > MAX_FIELD_CHARS or "\x00" in text:
            raise WorkloadError(f"{path}: row {row}: {field}: a NUL byte or over {MAX_FIELD_CHARS} characters")


def _job(path: Path, row: int, rec: dict[str, str | None], seen: set[str]) -> TraceJob:
    job_id = (rec["job_id"] or "").strip()
    if not job_id:
        raise WorkloadError(f"{path}: row {row}: job_id is empty")
    if job_id in seen:
        raise WorkloadError(f"{path}: row {row}: job_id {job_id!r} appears twice")
    seen.add(job_id)
    gpus = int(_number(path, row, "num_gpus", rec["num_gpus"] or "", integer=True))
    if gpus < 1:
        raise WorkloadError(f"{path}: row {row}: num_gpus must be at least 1, got {gpus}")
    submit = _number(path, row, "submit_time", rec["submit_time"] or "", integer=False)
    duration = _number(path, row, "duration", rec["duration"] or "", integer=False)
    if submit < 0:
        raise WorkloadError(f"{path}: row {row}: submit_time must be >= 0, got {submit}")
    if duration <= 0:
        raise WorkloadError(f"{path}: row {row}: duration must be > 0, got {duration}")
    model = (rec["model"] or "").strip()
    if not model:
        raise WorkloadError(f"{path}: row {row}: model is empty")
    return TraceJob(job_id, gpus, submit, duration, model)
