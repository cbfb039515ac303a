"""A multi-team job trace: ``team,job_id,num_gpus,submit_time,duration[,priority]`` (seconds), bounded and checked.

Every refusal is one line naming the file, row and field: a missing column, an empty or control
character team, a duplicate job id, a GPU count or time that is not a finite number in range, more
rows or bytes than a replay takes.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from broker.config.teams import check_team_name
from broker.errors import UserError
from broker.sim.fair_share import TeamJob

COLUMNS = ("team", "job_id", "num_gpus", "submit_time", "duration")
MAX_BYTES = 32 * 1024 * 1024
MAX_ROWS = 200_000
MAX_GPUS = 100_000
MAX_SECONDS = 365 * 86400.0


class TeamTraceError(UserError, ValueError):
    """A team trace that cannot be replayed; the message names the file, row and field."""


def _number(path: Path, row: int, field: str, text: str | None, low: float, high: float) -> float:
    try:
        value = float((text or "").strip())
    except ValueError:
        raise TeamTraceError(f"{path}: row {row}: {field} must be a number, got {(text or '')[:40]!r}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise TeamTraceError(f"{path}: row {row}: {field} must be between {low:g} and {high:g}, got {value:g}")
    return value


def read_team_trace(path: Path) -> list[TeamJob]:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise TeamTraceError(f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB")
        raw = path.read_bytes()
    except OSError as exc:
        raise TeamTraceError(f"cannot read team trace {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TeamTraceError(f"{path}: not text (expected UTF-8 CSV)") from None
    if "\x00" in text:
        raise TeamTraceError(f"{path}: not text (it holds NUL bytes)")
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise TeamTraceError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}[,priority]")
    jobs: list[TeamJob] = []
    seen: set[str] = set()
    try:
        for row, rec in enumerate(reader, start=2):
            if row - 1 > MAX_ROWS:
                raise TeamTraceError(f"{path}: more than {MAX_ROWS} jobs")
            try:
                team = check_team_name((rec.get("team") or "").strip())
            except ValueError as exc:
                raise TeamTraceError(f"{path}: row {row}: team: {exc}") from None
            job_id = (rec.get("job_id") or "").strip()
            if not job_id or len(job_id) > 100 or not job_id.isprintable():
                raise TeamTraceError(f"{path}: row {row}: job_id must be 1 to 100 printable characters")
            if job_id in seen:
                raise TeamTraceError(f"{path}: row {row}: job_id {job_id!r} appears twice")
            seen.add(job_id)
            gpus = _number(path, row, "num_gpus", rec.get("num_gpus"), 1, MAX_GPUS)
            if gpus != int(gpus):
                raise TeamTraceError(f"{path}: row {row}: num_gpus must be a whole number, got {gpus:g}")
            submit = _number(path, row, "submit_time", rec.get("submit_time"), 0, MAX_SECONDS)
            duration = _number(path, row, "duration", rec.get("duration"), 1, MAX_SECONDS)
            priority = rec.get("priority")
            level = int(_number(path, row, "priority", priority, 0, 10_000)) if priority not in (None, "") else 500
            jobs.append(TeamJob(team, job_id, int(gpus), submit, duration, level))
    except csv.Error as exc:
        raise TeamTraceError(f"{path}: not a CSV file: {exc}") from None
    if not jobs:
        raise TeamTraceError(f"{path}: no jobs")
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
