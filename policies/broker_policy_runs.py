"""What the ``broker`` policy learns from the market history: availability runs and outages.

The lengths of the zones' past availability runs (and outages) give how long a zone's current run
is expected to last given its age, how long an outage is expected to go on, and how much slack
running on spot alone is expected to spend. Everything is derived from ``MarketHistory`` rows up to
now and kept in the series' memo, so the next tick's call does not redo it.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

import numpy as np

from policies.history import MarketHistory
from policies.selection import Budget, SelectionRequest, ZoneOffer, eligible_offers

RUN_WINDOW_S = 4 * 86400.0  # availability runs and outages that ended this recently describe a zone
MIN_RUNS = 20  # fewer runs of its own (too few for a survival curve): judged on every zone's runs
SPOT_MARGIN = 0.5  # slack at this multiple of what spot alone is expected to spend is not short


def fresh_ratio(request: SelectionRequest, budget: Budget, offers: list[ZoneOffer]) -> float:
    """Steps paid per step of progress when entering a fresh run of the zone whose runs amortise a
    restart best (up or not now); at best one restart for all the work left."""
    k, work = budget.overhead, max(budget.work, 1)
    ratio = (k + work) / work
    history = request.history
    if history is None:
        return ratio
    window = round(RUN_WINDOW_S / budget.step_s)
    found = math.inf
    for offer in offers:
        column = history.column(offer.location)
        if column is None:
            continue
        runs = finished_runs(history, request.job.num_nodes, column, window)
        if runs.x:
            paid, progress = runs.expected(1, k, work)
            found = min(found, paid / max(progress, 1e-9))
    return max(ratio, found) if math.isfinite(found) else ratio


def spot_only_need(request: SelectionRequest, budget: Budget) -> float:
    """Slack that running the rest of the work on spot alone is expected to spend, with a margin.

    From the recent market: while no zone can take the gang the job waits, and each preemption
    costs a restart and the step it happens in. When the slack covers that (times SPOT_MARGIN),
    it is not short, however it compares with Uniform Progress's even pace: on an easy market a
    job on pace with days of slack must not go to on-demand for an outage of an hour."""
    history = request.history
    if history is None or request.job.remaining_work_s is None:
        return math.inf
    n = request.job.num_nodes
    key = ("broker.spot_only", n)
    table = history.series.memo.get(key)
    if table is None:
        gang = history.series.gang(n)
        ends = np.zeros(gang.up.shape[0], dtype=np.int64)
        for zone_ends in gang.run_end:
            np.add.at(ends, zone_ends, 1)
        table = history.series.memo[key] = (
            np.concatenate([[0], np.cumsum(gang.up.any(axis=1))]).tolist(),
            np.concatenate([[0], np.cumsum(ends)]).tolist(),
            gang.cum_up.sum(axis=1).tolist(),
        )
    assert isinstance(table, tuple)
    cum_any, cum_ends, cum_up = table
    now = history.now
    lo = max(0, now + 1 - round(RUN_WINDOW_S / budget.step_s))
    up = (cum_any[now + 1] - cum_any[lo]) / max(now + 1 - lo, 1)
    if up <= 0:
        return math.inf
    hazard = (cum_ends[now + 1] - cum_ends[lo]) / max(cum_up[now + 1] - cum_up[lo], 1)
    return SPOT_MARGIN * budget.work * ((1 - up) / up + hazard * (budget.overhead + 1))


def capacity_wait(request: SelectionRequest, budget: Budget, horizon: int) -> float:
    """Expected steps until some eligible zone can take the gang again, capped at ``horizon``,
    from how long the zones' past outages lasted given how long the current ones have."""
    history = request.history
    if history is None:
        return float(horizon)
    n = request.job.num_nodes
    window = round(RUN_WINDOW_S / budget.step_s)
    ages = history.age(n)
    still_down = np.ones(horizon)
    for offer in eligible_offers(request):
        column = history.column(offer.location)
        if column is None:
            continue
        if offer.available_nodes is not None and 0 < offer.available_nodes < n:
            # Part of the gang is obtainable: such outages have mostly ended within a few steps,
            # whatever their age (the zone's outages by age mix them with the ones at nothing).
            partly = partial_outage_survival(history, n, column, window, horizon)
            if partly.size:
                still_down *= partly
                continue
        outages = finished_runs(history, n, column, window, down=True)
        still_down *= outages.survival(int(ages[column]), horizon)
    return float(still_down.sum())


def partial_outage_survival(history: MarketHistory, n: int, zone: int, window: int, horizon: int) -> np.ndarray:
    """P(an outage still goes on after j more steps), j < ``horizon``, at a step where part of the
    gang was obtainable (0 < available nodes < ``n``): from the zone's such steps of the last
    ``window`` steps whose outage has ended by now, every zone's when it has fewer than
    ``MIN_RUNS``. Empty with fewer than ``MIN_RUNS`` even then."""
    key = ("broker.partial", n)
    table = history.series.memo.get(key)
    if table is None:  # per zone: (the outage's end, the partial step), for every partial step of an ended outage
        gang = history.series.gang(n)
        available = history.series.available_nodes
        steps: list[tuple[np.ndarray, np.ndarray]] = []
        for column, zone_ends in enumerate(gang.down_end):
            ticks = np.flatnonzero((available[:, column] > 0) & ~gang.up[:, column])
            after = np.searchsorted(zone_ends, ticks, side="right")  # the outage's end, if it has one
            ended = after < len(zone_ends)
            steps.append((zone_ends[after[ended]], ticks[ended]))  # ends ascend with the steps
        table = history.series.memo[key] = tuple(steps)
    assert isinstance(table, tuple)
    now = history.now

    def left(end: np.ndarray, tick: np.ndarray) -> np.ndarray:
        seen = int(np.searchsorted(end, now, side="right"))
        return (end[:seen] - tick[:seen])[tick[:seen] >= now - window]

    found = left(*table[zone])
    if len(found) < MIN_RUNS:
        found = np.concatenate([left(end, tick) for end, tick in table])
        if len(found) < MIN_RUNS:
            return np.empty(0)
    return np.array([(found > j).mean() for j in range(horizon)])


def recent_preemptions(request: SelectionRequest, offer: ZoneOffer) -> int:
    record = request.record.get(offer.location)
    if record is None:
        return 0
    return sum(1 for t in record.preemptions if (request.now - t).total_seconds() < 86400)


class RunLengths:
    """Finished availability-run lengths, sorted, with prefix sums for O(log n) expectations."""

    def __init__(self, lengths: np.ndarray) -> None:
        ordered = np.sort(lengths)
        self.x = ordered.tolist()
        self.prefix = np.concatenate([[0], np.cumsum(ordered)]).tolist()

    def _sum_min(self, age: int, cap: float, first: int) -> float:
        """Sum over runs at least ``age`` long of min(steps left in the run from now, cap)."""
        count = len(self.x) - first
        top = cap + age - 1
        last = bisect_right(self.x, top)
        return (self.prefix[last] - self.prefix[first]) + (len(self.x) - last) * top - (age - 1) * count

    def expected(self, age: int, restart: int, work: int) -> tuple[float, float]:
        """(steps paid, steps of progress) per entry now, for a run that has lasted ``age`` steps."""
        first = bisect_left(self.x, age)
        count = len(self.x) - first
        if count == 0:  # longer than any run seen: expect it to last about as long again
            paid = float(min(age, restart + work))
            return paid, max(paid - min(age, restart), 1e-9)
        paid = self._sum_min(age, restart + work, first)
        lost = self._sum_min(age, restart, first) if restart > 0 else 0.0
        return paid / count, max(paid - lost, 1e-9) / count

    def ends_before(self, age: int, steps: int) -> float:
        """P(the run that has lasted ``age`` steps ends within ``steps`` more steps)."""
        first = bisect_left(self.x, age)
        count = len(self.x) - first
        if count == 0:
            return float(age < steps)  # expected to last about as long again
        return (bisect_left(self.x, age + steps) - first) / count

    def survival(self, age: int, horizon: int) -> np.ndarray:
        """P(the run that has lasted ``age`` steps still goes on after j more steps), j < horizon."""
        first = bisect_left(self.x, age)
        count = len(self.x) - first
        if count == 0:
            return np.ones(horizon)
        return np.array([(len(self.x) - bisect_left(self.x, age + j)) / count for j in range(horizon)])


def told_runs(history: MarketHistory, n: int, zone: int, window: int, told: float, weight: int) -> RunLengths | None:
    """The zone's own finished up-runs of the last ``window`` steps plus ``weight`` runs of the
    cloud's expected length ``told`` (steps); None when the zone has ``MIN_RUNS`` of its own."""
    gang = history.series.gang(n)
    ends = gang.run_end[zone]
    lo = int(np.searchsorted(ends, history.now - window, side="right"))
    hi = int(np.searchsorted(ends, history.now, side="right"))
    if hi - lo >= MIN_RUNS:
        return None
    key = ("broker.told", n, zone, lo, hi, round(told, 3), weight)
    found = history.series.memo.get(key)
    if found is None:
        # ``weight`` runs at the quantiles of memoryless runs of mean ``told``: the cloud gives a
        # mean, not a shape, and runs of one length only would say a run past it never ends
        quantiles = -np.log1p(-(np.arange(weight) + 0.5) / weight)
        told_lengths = np.maximum(np.round(told * quantiles / quantiles.mean()), 1)
        found = history.series.memo[key] = RunLengths(
            np.concatenate([gang.run_length[zone][lo:hi], told_lengths]))
    assert isinstance(found, RunLengths)
    return found


def finished_runs(history: MarketHistory, n: int, zone: int, window: int, down: bool = False) -> RunLengths:
    """The zone's finished up-runs (or outages) of the last ``window`` steps; every zone's when it
    has too few of its own."""
    gang = history.series.gang(n)
    all_ends = gang.down_end if down else gang.run_end
    all_lengths = gang.down_length if down else gang.run_length
    memo = history.series.memo
    table_key = ("broker.run-bounds", n, down, window)
    table = memo.get(table_key)
    if table is None:  # for every tick at once: which finished runs fall in its window
        now = np.arange(history.series.num_ticks)
        table = memo[table_key] = [
            tuple(zip(*(np.searchsorted(ends, edge, side="right").tolist() for ends in all_ends), strict=True))
            for edge in (now - window, now)
        ]
    assert isinstance(table, list)
    bounds = tuple(zip(table[0][history.now], table[1][history.now], strict=True))
    lo, hi = bounds[zone]
    pooled = hi - lo < MIN_RUNS
    key = ("broker.runs", n, down, bounds) if pooled else ("broker.runs", n, down, zone, lo, hi)
    found = memo.get(key)
    if found is None:
        if pooled:
            lengths = np.concatenate([all_lengths[z][a:b] for z, (a, b) in enumerate(bounds)])
        else:
            lengths = all_lengths[zone][lo:hi]
        found = memo[key] = RunLengths(lengths)
    assert isinstance(found, RunLengths)
    return found
