"""``broker``: the default selection policy: the cheapest progress that still meets the deadline.

(``broker_lean``, registered beside it, is ``broker`` with a check on itself: every step it replays
the job's own market since the job started under ``broker``, ``up_multi`` and ``skypilot_eager``
(``policies.broker_policy_replay``) and, once a simpler rule's replayed job is clearly worth less,
follows that rule, under the same deadline floor; on on-demand, ``broker`` decides when to leave
(the simpler rules never leave on-demand). Measured on the job-shape grid it is no better than
``broker`` (benchmarks/README.md), so it is not the default.)

Each step ``broker`` prices every zone that can take the gang as *expected dollars per step of progress*:
the zone's spot price projected along its recent trend, times the restart overhead amortised over
the run the zone is expected to give, plus checkpoint egress when the zone is in another region
than the checkpoint. The expected run comes from the lengths of the zone's past availability runs
(its hazard, learned from the market history; every zone's runs when it has too few), given how
long the current one has lasted already, so capacity that tends to vanish young is priced high.
Where the cloud states its own expected uptime for the zone (``ZoneOffer.prior_uptime_s``: GCP's
estimated uptime or preemption rate) and the zone has fewer than ``MIN_RUNS`` runs of its own, the
cloud's figure is the prior instead of the other zones' runs: it counts as ``PRIOR_RUNS`` runs of
that length, averaged with the zone's own, and the run is taken as memoryless with that mean.

Slack (steps left minus work left) is spent against a reserve that would spend it evenly until the
deadline (Uniform Progress's line: when spot cannot cover the work, the cheapest plans use spot
until the end, so slack must not run out early). Its *pressure* sets what a step of slack is
worth: nothing with slack to spare, a step of on-demand instead of spot when short. Slack is
never short while it is at least ``SPOT_MARGIN`` x what running on spot alone is expected to spend
(outages and restarts learned from the recent market): on an easy market, falling behind the even
pace is no reason for on-demand. Below that the pressure grows in proportion, to full at half of
it. A job whose work is unknown (no ``work``, no estimate: see ``policies.work_estimate``) has no
pressure; the deadline floor alone guards it. With offers of
several GPU types (``any_of``) the job is narrowed first to the type whose unit of work is
cheapest (``policies.speed``). Then:

- on spot: stay, unless another zone gives progress much cheaper, restart and egress included;
- idle with slack to spare: enter spot whose expected cost is near the cheapest price (with the
  restart amortised as well as the best fresh run any zone gives), else wait; but where the slack
  is less than ``PICKY_ROOM`` x what spot alone is expected to spend, enter any spot cheaper than
  on-demand (the slack a wait spends is then likely to be missed later);
- idle under pressure: enter spot cheaper than on-demand (slack it risks counted), unless
  letting young capacity prove itself is cheaper; with no such spot, wait if the outage is likely
  shorter than on-demand's two restarts would justify (time to capacity learned from the zones'
  past outages; for a zone that can give part of the gang now, from its past steps that could)
  and waiting keeps the slack near its reserve or the work left is short next to the slack
  (``SHORT_REST``: being caught by the floor then puts little work on on-demand), else
  run on-demand; when spot is up but too short-lived to beat on-demand, that same wait would have
  no outage to wait out, so it enters the spot instead;
- on on-demand: leave for the spot zone with the largest expected saving over staying (restarts
  there and back, egress and the slack they spend counted), once its capacity has lasted long
  enough that letting it prove itself for longer would no longer pay: waiting costs nothing but
  the spot discount of the steps waited, while entering capacity that dies young costs two
  restarts.

A hard floor keeps the deadline whenever on-demand can still meet it: off spot, spot is entered
only with ``slack >= 2 x overhead + 1`` steps (a restart plus a preemption still leave room to
finish on on-demand); on spot the job leaves for on-demand before a preemption could make the
deadline unreachable. The policy reads nothing but its request and is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from policies.baselines import skypilot_eager, up_multi
from policies.broker_policy_replay import Rule, leading_rule
from policies.broker_policy_runs import (
    RUN_WINDOW_S,
    RunLengths,
    capacity_wait,
    finished_runs,
    fresh_ratio,
    recent_preemptions,
    spot_only_need,
    told_runs,
)
from policies.selection import (
    ON_DEMAND,
    SELECTION_POLICIES,
    Budget,
    Location,
    Plan,
    SelectionRequest,
    ZoneOffer,
    current_offer,
    eligible_offers,
    on_demand_plan,
    spot_ok,
)
from policies.speed import rank_accelerators

NO_HISTORY_RUN_S = 4 * 3600.0  # without history, a zone's capacity is expected to last this long
TREND_WINDOW_S = 6 * 3600.0  # the spot price's trend is its change over this window
RELAXED = 1.5  # slack at this multiple of the reserve or more: slack is worth nothing
PRESSED = 0.5  # at this multiple or less: a step of slack is worth a step of on-demand
PICKINESS = 0.15  # with slack to spare, enter spot costing at most this much over the best possible
PICKY_ROOM = 4.0  # ... as long as the slack is this multiple of what spot alone is expected to spend
SWITCH_GAIN = 0.08  # move between zones only for this much cheaper progress
WAITS = (1, 2, 3, 4, 6)  # steps young capacity may be given to prove itself before entering
WAIT_FLOOR = 0.8  # under pressure, waiting never takes the slack below this fraction of the reserve
SHORT_REST = 8.0  # ... unless the work left is at most this many times the slack left after the wait
PRIOR_RUNS = 5  # the cloud's own expected uptime weighs as this many of the zone's runs

@dataclass(frozen=True, slots=True)
class _Option:
    offer: ZoneOffer
    cost: float  # expected USD per node-step of progress, restarts and egress included
    progress: float = math.inf  # expected steps of progress before capacity goes
    price: float = 0.0  # the spot price expected over that run
    runs: RunLengths | None = None  # the runs it was judged on, and how long its current one has lasted
    age: int = 0
    egress: float = 0.0  # checkpoint egress to enter, in price x node-steps


@SELECTION_POLICIES.register("broker_lean")
def broker_lean(request: SelectionRequest) -> Plan:
    """``broker``, or the simpler rule that the job's own market shows is winning on it
    (``policies.broker_policy_replay``), under the same deadline floor."""
    request = _one_gpu_type(request)
    floor = _deadline_floor(request)
    if floor is not None:
        return floor
    found = leading_rule(request, RULES)
    if found is None or found.leader == 0 or request.current.kind == ON_DEMAND:
        # The simpler rules treat on-demand as the end (their safety net): when broker's reasoning
        # took the job there, broker's reasoning decides when it leaves.
        return broker(request)
    plan = RULES[found.leader](request)
    return replace(plan, reason=f"{RULE_NAMES[found.leader]} is winning on this market: {plan.reason}")


def _deadline_floor(request: SelectionRequest) -> Plan | None:
    """On-demand when only on-demand still meets the deadline: off spot, with less slack than a
    restart plus a preemption need; on spot, less than a preemption and a restart need."""
    budget = Budget.of(request)
    k = budget.overhead
    here = current_offer(request)
    on_spot = here is not None and spot_ok(here, request.job.num_nodes)
    floor = (k + 1 + (budget.overhead_left > 0)) if on_spot else 2 * k + 1
    if budget.slack < floor:
        return on_demand_plan(request, "deadline floor: only on-demand still meets the deadline")
    return None


@SELECTION_POLICIES.register("broker", default=True)
def broker(request: SelectionRequest) -> Plan:
    """Cheapest expected progress among spot zones, waiting or on-demand as the slack allows."""
    request = _one_gpu_type(request)
    floor = _deadline_floor(request)
    if floor is not None:
        return floor
    budget = Budget.of(request)
    k, slack = budget.overhead, budget.slack
    n = request.job.num_nodes
    here = current_offer(request)
    on_spot = here is not None and spot_ok(here, n)

    offers = eligible_offers(request)
    od_price = min((o.on_demand_price for o in offers), default=math.inf)
    cheapest = min((_projected(request, o, budget) for o in offers), default=math.inf)
    need = _paced(request, budget)
    have = slack - (2 * k + 1)
    # How likely the slack is to run out: a step of slack is then worth a step of on-demand
    # instead of spot later; with plenty to spare it is worth nothing.
    pressure = 0.0 if need <= 0 else min(1.0, max(0.0, (RELAXED - have / need) / (RELAXED - PRESSED)))
    if pressure > 0:
        # Behind the even pace, but spot alone may still finish in time: no pressure while the slack
        # covers what spot alone is expected to spend (with its margin), full pressure at half that,
        # and in between in proportion (a cliff there sent jobs to on-demand over one step of slack).
        spot_need = spot_only_need(request, budget)
        pressure = min(pressure, max(0.0, 2 * (1 - have / spot_need))) if spot_need > 0 else 0.0
    worth = pressure * max(od_price - cheapest, 0.0)
    options = sorted((_price(request, budget, o, worth) for o in offers if spot_ok(o, n) and o is not here),
                     key=lambda opt: (opt.cost, opt.offer.location))
    best = options[0] if options else None

    if on_spot and here is not None:
        stay = _price(request, budget, here, worth, restart=budget.overhead_left)
        if best is not None and have - need >= k + 1 and best.cost < stay.cost * (1 - SWITCH_GAIN):
            return _go(best, options, "cheaper progress elsewhere is worth a restart")
        return _go(stay, options, "stay: no cheaper progress worth a restart")

    if request.current.kind == ON_DEMAND:
        if options:
            gains = [(_entry_gain(o, budget, od_price, worth), o) for o in options]
            gain, leave = max(gains, key=lambda g: g[0])
            if gain > 0 and _entry_wait(leave, budget, od_price, worth, idle=False) == 0:
                return _go(leave, options, "spot saves more than the restarts there and back: leave on-demand")
        return on_demand_plan(request, "stay on on-demand: no spot worth two restarts")

    if pressure == 0.0:
        # the best any spot could do: the cheapest price with one restart for all the work left
        # (or, where runs are short in every zone, as good as a fresh run in the best zone gives:
        # waiting for a run no zone gives would spend the slack for nothing)
        # Waiting for better spot spends slack. Where the market's outages and restarts are expected
        # to need a good part of it, a step waited now is a step of on-demand later: then any spot
        # whose progress is cheaper than on-demand is good enough.
        spot_need = spot_only_need(request, budget)
        if not math.isfinite(spot_need) or have >= PICKY_ROOM * spot_need:
            good, why = (cheapest * fresh_ratio(request, budget, offers) * (1 + PICKINESS),
                         "good spot: expected progress near the cheapest price")
        else:
            good, why = od_price, "spot cheaper than on-demand: the market's outages may need the slack a wait spends"
        if best is not None and best.cost <= good:
            if _entry_wait(best, budget, od_price, worth, idle=True) > 0:
                return Plan((), reason="this capacity often vanishes this young: see if it lasts")
            return _go(best, options, why)
        return Plan((), reason="slack to spare: wait for good spot")
    if best is not None and best.cost < od_price:
        if have > 1 and _entry_wait(best, budget, od_price, worth, idle=True) > 0:
            return Plan((), reason="this capacity often vanishes this young: see if it lasts")
        return _go(best, options, "spot cheaper than on-demand, the slack it risks counted")
    if have - 1 >= need:
        return Plan((), reason="ahead of the slack reserve: wait for spot")
    # Waiting out the outage costs its expected length in slack; on-demand costs two restarts.
    horizon = 4 * k + 2
    expected = capacity_wait(request, budget, horizon)
    # Below the reserve, waiting risks meeting the deadline floor and running the rest of the work
    # on on-demand: a risk worth taking when the rest is short (a short job's on-demand detour buys
    # slack its few remaining outages seldom need), not when it is long.
    if expected * worth < k * (od_price + worth) and (have - expected >= need * WAIT_FLOOR
                                                      or budget.work <= SHORT_REST * (have - expected)):
        if best is not None:
            # Spot is up, only judged too short-lived to beat on-demand: there is no outage to wait
            # out, so a wait would spend slack for nothing, while even short runs give some progress.
            return _go(best, options, "spot is up, if short-lived: better than a wait with no outage to wait out")
        return Plan((), reason="capacity is likely back before on-demand would pay off")
    return on_demand_plan(request, "slack is short and the outage looks long: on-demand")


def _one_gpu_type(request: SelectionRequest) -> SelectionRequest:
    """With offers of several GPU types (``any_of``), the request narrowed to the type whose unit of
    work is cheapest (policies.speed), its work counted in time on that type. A job on spot stays
    on its type unless another is SWITCH_GAIN cheaper per unit of work."""
    kinds = {o.accelerator for o in request.offers}
    job = request.job
    if len(kinds) < 2 or job.accelerator is None:
        return request
    stated = dict(job.speed)
    up = [o for o in eligible_offers(request) if spot_ok(o, job.num_nodes)] or eligible_offers(request)
    ranked = rank_accelerators(((o.accelerator, o.spot_price) for o in up), job.accelerator, stated)
    if not ranked:
        return request
    best = ranked[0]
    here = current_offer(request)
    if here is not None:
        mine = next((c for c in ranked if c.accelerator == here.accelerator), None)
        if mine is not None and best.per_work >= mine.per_work * (1 - SWITCH_GAIN):
            best = mine
    scale = 1 / best.speed
    return replace(
        request, offers=tuple(o for o in request.offers if o.accelerator == best.accelerator),
        job=replace(job, accelerator=best.accelerator,
                    remaining_work_s=None if job.remaining_work_s is None else job.remaining_work_s * scale,
                    total_work_s=None if job.total_work_s is None else job.total_work_s * scale))


def _entry_gain(option: _Option, budget: Budget, od_price: float, worth: float, age: int | None = None) -> float:
    """Expected saving, in price x node-steps, of entering ``option``'s zone now (its run having
    lasted ``age`` steps) over doing the work on on-demand: the progress it gives at spot instead of
    on-demand prices, less the restart it pays, the restart back when the capacity goes before the
    work is done, the egress, and the slack all of that spends at ``worth`` a step."""
    k, work = budget.overhead, max(budget.work, 1)
    runs = option.runs
    if runs is None:
        progress = min(option.progress, work)
        paid, short = progress + k, float(progress < work)
    else:
        paid, progress = runs.expected(option.age if age is None else age, k, work)
        short = runs.ends_before(option.age if age is None else age, k + work)
    spent = (paid - progress) + short * (1 + k)
    return od_price * progress - option.price * paid - short * od_price * k - option.egress - worth * spent


def _entry_wait(option: _Option, budget: Budget, od_price: float, worth: float, idle: bool) -> int:
    """Steps to let ``option``'s capacity prove itself before entering (0: enter now).

    Waiting ``d`` steps lets the runs that die young die first. From on-demand it costs only the
    spot price difference of those steps; idle, it also spends ``d`` steps of slack, and the
    alternative to spot is a restart on on-demand."""
    runs = option.runs
    if runs is None:
        return 0
    k = budget.overhead
    base = k * (od_price + worth) if idle else 0.0
    best_gain, best_wait = _entry_gain(option, budget, od_price, worth) + base, 0
    alive = runs.survival(option.age, max(WAITS) + 1)
    for wait in WAITS:
        if idle and wait >= budget.slack - (2 * k + 1):
            break
        survive = float(alive[wait])
        if survive <= 0:
            break
        if survive >= 1:
            continue  # no run ends this young: waiting would filter nothing out
        gain = survive * (_entry_gain(option, budget, od_price, worth, option.age + wait) + base)
        if idle:
            gain -= worth * wait
        if gain > best_gain:
            best_gain, best_wait = gain, wait
    return best_wait


def _paced(request: SelectionRequest, budget: Budget) -> float:
    """Slack to keep if it is spent evenly until the deadline (Uniform Progress's line)."""
    job = request.job
    if job.deadline is None or job.remaining_work_s is None:
        # No deadline, or no idea of the work left (see policies.work_estimate): slack is never
        # short; the deadline floor alone still turns to on-demand when the deadline comes near.
        return 0.0
    if job.total_work_s is None or job.started_at is None:
        return float(budget.slack)  # pace unknown: keep what is left, a middling pressure
    span = (job.deadline - job.started_at).total_seconds() / budget.step_s
    total = job.total_work_s / budget.step_s
    return budget.left * max(span - total, 0.0) / max(span, 1e-9)


def _go(first: _Option, options: list[_Option], reason: str) -> Plan:
    """``first``, then the other zones best first, for when a launch fails on a capacity error."""
    rest = tuple(Location("spot", o.offer) for o in options if o.offer is not first.offer)
    return Plan((Location("spot", first.offer), *rest), reason=reason)


def _price(request: SelectionRequest, budget: Budget, offer: ZoneOffer, worth: float,
           restart: int | None = None) -> _Option:
    """Expected USD per node-step of progress if the job runs in ``offer``'s zone from now.

    ``restart`` is the overhead still to pay (default: a full restart, as when entering); the
    steps it and the eventual preemption take from the slack are charged at ``worth`` each.
    """
    k = budget.overhead if restart is None else restart
    work = max(budget.work, 1)
    history = request.history
    column = history.column(offer.location) if history is not None else None
    runs: RunLengths | None = None
    age = 0
    told = None if offer.prior_uptime_s is None else offer.prior_uptime_s / budget.step_s  # in steps
    if history is not None and column is not None:
        age = int(history.age(request.job.num_nodes)[column])
        window = round(RUN_WINDOW_S / budget.step_s)
        runs = finished_runs(history, request.job.num_nodes, column, window)
        if not runs.x:
            runs = None  # no run has ended anywhere yet: the history says nothing about run lengths
        if told is not None:
            # fewer than MIN_RUNS runs of its own: the cloud's word instead of the other zones' runs
            runs = told_runs(history, request.job.num_nodes, column, window, told, PRIOR_RUNS) or runs
            told = None
    if told is not None or runs is None:
        # the cloud's expected run (or, when it says nothing, NO_HISTORY_RUN_S), at least as long
        # as the current run has lasted already
        prior = NO_HISTORY_RUN_S / budget.step_s if told is None else told
        mean = max(prior / (1 + recent_preemptions(request, offer)), age)
        paid = min(mean, k + work)
        progress = max(paid - k, 1e-9)
    else:
        paid, progress = runs.expected(age, k, work)
    price = _projected(request, offer, budget, horizon=min(paid, work))
    egress = 0.0
    if (request.checkpoint_region is not None and offer.region_key != request.checkpoint_region
            and restart is None):
        node_hours = request.job.num_nodes * budget.step_s / 3600.0
        egress = request.job.checkpoint_gb * request.egress_per_gb / node_hours
    runs_seen = None if history is None or column is None else runs
    return _Option(offer, (price * paid + worth * (k + 1) + egress) / progress, progress, price,
                   runs_seen, 0 if runs_seen is None else age, egress)


def _projected(request: SelectionRequest, offer: ZoneOffer, budget: Budget, horizon: float = 0.0) -> float:
    """The spot price along its recent trend, averaged over the next ``horizon`` steps."""
    history = request.history
    column = history.column(offer.location) if history is not None else None
    if history is None or column is None or horizon <= 0:
        return offer.spot_price
    window = max(1, round(TREND_WINDOW_S / budget.step_s))
    key = ("broker.slope", window)
    slopes = history.series.memo.get(key)
    if slopes is None:  # price change per step over the trailing window, every tick at once
        price = history.series.spot_price
        before = price[np.maximum(np.arange(len(price)) - window, 0)]
        slopes = history.series.memo[key] = ((price - before) / window).tolist()
    assert isinstance(slopes, list)
    slope = slopes[history.now][column]
    ahead = min(horizon, window) / 2
    return max(offer.spot_price + slope * ahead, 0.0)


RULES: tuple[Rule, ...] = (broker, up_multi, skypilot_eager)
RULE_NAMES = ("broker", "up_multi", "skypilot_eager")
