"""The omniscient optimum: the cheapest schedule that meets the deadline, knowing the whole future.

It cannot be a per-step policy (it needs the future), so its entry point is ``solve(problem)``: a
dynamic program over ``(tick, location, restart steps left, checkpoint region, progress)`` under
exactly the simulator's rules (see ``broker/sim/market.py``). The simulator builds the problem for
a start tick, solves it and replays the schedule through the same accounting as every other policy.
The name ``optimal`` is registered so that it is listed and chosen like the others; calling it
per step raises ``OmniscientOnly``.

Progress is a vector dimension, so a tick costs a few hundred numpy operations on arrays of
``work + 1`` entries, whatever the number of states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.errors import PolicyError
from policies.selection import SELECTION_POLICIES, Plan, SelectionRequest

IDLE_CODE = -1
ON_DEMAND_CODE = -2


class OmniscientOnly(PolicyError, RuntimeError):
    """``optimal`` needs the whole trace: only the simulator can run it."""


@dataclass(frozen=True)
class Problem:
    """One job over its deadline window; tick 0 is its start."""

    up: np.ndarray  # [tick, zone] bool: spot can hold the gang
    spot_cost: np.ndarray  # [tick, zone] USD for one tick of the whole gang on spot
    on_demand_cost: np.ndarray  # [tick] USD for one tick of the gang on on-demand
    region: tuple[int, ...]  # per zone: its region's index
    work: int  # ticks of progress needed
    deadline: int  # ticks available
    overhead: int  # ticks lost at every (re)start
    egress: float  # USD to move the checkpoint to another region


@dataclass(frozen=True)
class Solution:
    cost: float
    schedule: np.ndarray  # location code per tick until the work is done: zone, -1 idle, -2 on-demand
    feasible: bool  # False: not even on-demand meets the deadline; the schedule is on-demand at once


@SELECTION_POLICIES.register("optimal", simulator_only=True)
def optimal(request: SelectionRequest) -> Plan:
    raise OmniscientOnly("the optimal policy sees the whole trace; run it with `broker simulate`")


def solve(problem: Problem) -> Solution:
    work, deadline, k = problem.work, problem.deadline, problem.overhead
    if work + k > deadline:
        schedule = np.full(k + work, ON_DEMAND_CODE, dtype=np.int16)
        cost = float(problem.on_demand_cost[: k + work].sum())
        return Solution(cost, schedule, feasible=False)
    return _Solver(problem).run()


class _Solver:
    def __init__(self, problem: Problem) -> None:
        self.p = problem
        zones = problem.up.shape[1]
        self.zones = zones
        self.tags = (max(problem.region) + 2) if zones else 1  # 0: no checkpoint yet, 1 + region
        self.kk = max(problem.overhead, 1)
        self.enter_r = max(problem.overhead - 1, 0)
        kk, tags = self.kk, self.tags
        self.n_states = zones * kk + tags * kk + tags
        self.code = np.empty(self.n_states, dtype=np.int16)
        self.r_of = np.zeros(self.n_states, dtype=np.int64)
        self.running = np.zeros(self.n_states, dtype=bool)
        self.loc_of = np.empty(self.n_states, dtype=np.int64)  # one id per location
        for z in range(zones):
            for r in range(kk):
                s = self.spot(z, r)
                self.code[s], self.r_of[s], self.running[s], self.loc_of[s] = z, r, True, z
        for c in range(tags):
            for r in range(kk):
                s = self.od(c, r)
                self.code[s], self.r_of[s], self.running[s], self.loc_of[s] = ON_DEMAND_CODE, r, True, zones + c
            s = self.idle(c)
            self.code[s], self.loc_of[s] = IDLE_CODE, zones + tags + c

    def spot(self, z: int, r: int) -> int:
        return z * self.kk + r

    def od(self, c: int, r: int) -> int:
        return self.zones * self.kk + c * self.kk + r

    def idle(self, c: int) -> int:
        return self.zones * self.kk + self.tags * self.kk + c

    def shifts(self, src: int, tgt: int) -> bool:
        if not self.running[tgt] or self.r_of[tgt] != 0:
            return False
        return src == tgt or (self.p.overhead == 0 and self.loc_of[src] != self.loc_of[tgt])

    def run(self) -> Solution:
        p = self.p
        work, width = p.work, p.work + 1
        n_states, kk, tags, zones = self.n_states, self.kk, self.tags, self.zones
        inf = np.inf
        cost = np.full((n_states, width), inf)
        cost[self.idle(0), 0] = 0.0
        args = np.full((p.deadline, n_states, width), -1, dtype=np.int16)
        best = (inf, -1, -1)
        enter_shift = p.overhead == 0
        region_tag = [r + 1 for r in p.region]
        for i in range(p.deadline):
            up = p.up[i]
            new = np.full((n_states, width), inf)
            arg = args[i]

            def relax(tgt: int, value: np.ndarray, src: np.ndarray | int, extra: float, shift: bool,
                      new: np.ndarray = new, arg: np.ndarray = arg) -> None:
                if shift:
                    cand = np.full(width, inf)
                    cand[1:] = value[:-1] + extra
                    srcs = src[:-1] if isinstance(src, np.ndarray) else src
                    better = cand < new[tgt]
                    new[tgt][better] = cand[better]
                    if isinstance(srcs, np.ndarray):
                        arg[tgt][1:][better[1:]] = srcs[better[1:]]
                    else:
                        arg[tgt][better] = srcs
                    return
                cand = value + extra
                better = cand < new[tgt]
                new[tgt][better] = cand[better]
                arg[tgt][better] = src[better] if isinstance(src, np.ndarray) else src

            # The cheapest way to be in each location now, over its restart steps (for leaving it).
            loc_val: list[np.ndarray] = []
            loc_src: list[np.ndarray] = []
            for first in [self.spot(z, 0) for z in range(zones)] + [self.od(c, 0) for c in range(tags)]:
                block = cost[first:first + kk]
                which = block.argmin(axis=0)
                loc_val.append(block[which, np.arange(width)])
                loc_src.append((which + first).astype(np.int16))
            for c in range(tags):
                s = self.idle(c)
                loc_val.append(cost[s])
                loc_src.append(np.full(width, s, dtype=np.int16))
            spot_loc = range(zones)
            od_loc = [zones + c for c in range(tags)]
            idle_loc = [zones + tags + c for c in range(tags)]
            movable_zone = [bool(up[z]) for z in range(zones)]
            spot_cost = p.spot_cost[i]
            od_cost = float(p.on_demand_cost[i])

            # idle(c): from idle(c), on-demand(c), any spot zone of region c (preempted or not).
            for c in range(tags):
                tgt = self.idle(c)
                relax(tgt, loc_val[idle_loc[c]], loc_src[idle_loc[c]], 0.0, False)
                relax(tgt, loc_val[od_loc[c]], loc_src[od_loc[c]], 0.0, False)
                for z in spot_loc:
                    if region_tag[z] == c:
                        relax(tgt, loc_val[z], loc_src[z], 0.0, False)
            # spot z: continue (restart steps, then progress) or enter from anywhere else movable.
            for z in spot_loc:
                if not up[z]:
                    continue
                price = float(spot_cost[z])
                for r in range(kk - 1):
                    relax(self.spot(z, r), cost[self.spot(z, r + 1)], self.spot(z, r + 1), price, False)
                relax(self.spot(z, 0), cost[self.spot(z, 0)], self.spot(z, 0), price, True)
                tgt = self.spot(z, self.enter_r)
                tag = region_tag[z]
                for loc in range(zones + 2 * tags):
                    if loc == z or (loc < zones and not movable_zone[loc]):
                        continue
                    src_tag = region_tag[loc] if loc < zones else (loc - zones) % tags
                    extra = price + (p.egress if src_tag not in (0, tag) else 0.0)
                    relax(tgt, loc_val[loc], loc_src[loc], extra, enter_shift)
            # on-demand(c): continue, or enter from idle(c) or a movable spot zone of region c.
            for c in range(tags):
                for r in range(kk - 1):
                    relax(self.od(c, r), cost[self.od(c, r + 1)], self.od(c, r + 1), od_cost, False)
                relax(self.od(c, 0), cost[self.od(c, 0)], self.od(c, 0), od_cost, True)
                tgt = self.od(c, self.enter_r)
                relax(tgt, loc_val[idle_loc[c]], loc_src[idle_loc[c]], od_cost, enter_shift)
                for z in spot_loc:
                    if region_tag[z] == c and movable_zone[z]:
                        relax(tgt, loc_val[z], loc_src[z], od_cost, enter_shift)

            done = new[:, work]
            j = int(done.argmin())
            if done[j] < best[0]:
                best = (float(done[j]), i, j)
            new[:, work] = inf
            cost = new
        total, last, state = best
        schedule = np.empty(last + 1, dtype=np.int16)
        progress = work
        for i in range(last, -1, -1):
            schedule[i] = self.code[state]
            src = int(args[i, state, progress])
            if self.shifts(src, state):
                progress -= 1
            state = src
        return Solution(total, schedule, feasible=True)
