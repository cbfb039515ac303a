"""The fair-share replay: a hand-made two-team trace, the Philly multi-team trace and its acceptance figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.sim.fair_share import (
    BURST_S,
    MAX_DURATION_S,
    PHILLY_TEAMS,
    TeamJob,
    _releases,
    _Run,
    _team_releases,
    philly_teams,
    replay,
)
from policies import kinds
from policies.fair_share import Team, weighted_fair_share
from policies.fair_share_baselines import fifo, static_quota

TWO = (Team("a"), Team("b"))


def _two_teams() -> list[TeamJob]:
    # a fills the fleet with four long 1-GPU jobs; b comes ten minutes later with two short ones.
    return [TeamJob("a", f"a{i}", 1, 0.0, 4 * 3600.0) for i in range(4)] + \
           [TeamJob("b", f"b{i}", 1, 600.0, 1800.0) for i in range(2)]


def test_the_owner_gets_its_share_back_at_a_checkpoint() -> None:
    result = replay(_two_teams(), TWO, 4, weighted_fair_share, "fair", checkpoint_s=60.0, restart_s=60.0)
    assert result.unfinished == 0
    assert len(result.handovers_s) == 2 and max(result.handovers_s) == 60.0
    assert result.lost_per_reclaim_s == [120.0, 120.0]
    assert result.teams["a"].reclaims == 2
    # b waited one step for the reclaim and the checkpoint only, not for a's jobs to end.
    assert max(result.teams["b"].waits_s) <= 60.0 + 60.0
    baseline = replay(_two_teams(), TWO, 4, fifo, "fifo")
    assert baseline.handovers_s == [] and min(baseline.teams["b"].waits_s) >= 4 * 3600.0 - 600.0
    # The borrower lost at most what the reclaims cost it; nothing runs twice.
    assert result.makespan_s <= baseline.makespan_s + 2 * 120.0


def test_a_static_quota_lends_nothing() -> None:
    result = replay([TeamJob("a", f"a{i}", 1, 0.0, 3600.0) for i in range(4)], TWO, 4, static_quota, "static")
    assert result.makespan_s >= 2 * 3600.0  # two at a time: b's half stays idle
    assert result.utilisation == pytest.approx(0.5, abs=0.02)
    fair = replay([TeamJob("a", f"a{i}", 1, 0.0, 3600.0) for i in range(4)], TWO, 4, weighted_fair_share, "fair")
    assert fair.utilisation > 0.95


def test_the_philly_teams_trace_follows_its_rule(shared_traces: Path) -> None:
    jobs = philly_teams(shared_traces)
    assert len(jobs) == 640 and {j.team for j in jobs} == {t.name for t in PHILLY_TEAMS}
    assert max(j.duration_s for j in jobs) == MAX_DURATION_S
    for team in ("speech", "rl"):
        submits = sorted(j.submit_s for j in jobs if j.team == team)
        bursts = [submits[0]]
        for at in submits[1:]:
            if at - bursts[-1] > BURST_S:
                bursts.append(at)
        assert len(bursts) <= 3
    assert philly_teams(shared_traces) == jobs  # seeded
    assert philly_teams(shared_traces, seed=7) != jobs


@pytest.mark.slow
def test_on_the_philly_teams_fair_share_keeps_shares_and_utilisation(shared_traces: Path) -> None:
    jobs = philly_teams(shared_traces)
    fair = replay(jobs, PHILLY_TEAMS, 128, kinds.fair_share.get("weighted_fair_share"), "fair")
    baseline = replay(jobs, PHILLY_TEAMS, 128, kinds.fair_share.get("fifo"), "fifo")
    assert fair.unfinished == baseline.unfinished == 0
    assert fair.utilisation >= baseline.utilisation
    assert fair.worst_window_error <= 0.10 < baseline.worst_window_error
    assert max(fair.handovers_s) <= 60.0 + 60.0


def test_a_window_counts_only_for_a_team_that_had_work_waiting_throughout_it() -> None:
    # a fills the 2-GPU fleet for two hours; b's job comes at the first window's last step.
    jobs = [TeamJob("a", f"a{i}", 1, 0.0, 2 * 3600.0) for i in range(2)] + [TeamJob("b", "b0", 1, 3540.0, 1800.0)]
    fair = replay(jobs, TWO, 2, weighted_fair_share, "fair", checkpoint_s=60.0, restart_s=60.0)
    # b waited one step in the first window and one in the second (the checkpoint): neither counts.
    assert fair.teams["b"].windows == 0 and fair.worst_window_error == 0.0
    # Under FIFO b waits for a's jobs through the whole second window: that one counts, all short.
    baseline = replay(jobs, TWO, 2, fifo, "fifo")
    assert baseline.teams["b"].windows == 1 and baseline.teams["b"].worst_window_error == 1.0


def test_a_reclaim_takes_the_borrowers_smaller_gang_not_the_large_one_just_started() -> None:
    # b borrows the idle fleet: a 2-GPU gang from the start, a 4-GPU one ten minutes in; a minute later a's
    # 4-GPU gang needs 2 GPUs back. By work lost alone the 4-GPU gang (a minute old) would go; the 2-GPU one does.
    jobs = [TeamJob("b", "b-small", 2, 3600.0, 4 * 3600.0), TeamJob("b", "b-large", 4, 4200.0, 4 * 3600.0),
            TeamJob("a", "a0", 4, 4260.0, 3600.0)]
    result = replay(jobs, TWO, 8, weighted_fair_share, "fair", checkpoint_s=60.0, restart_s=60.0)
    assert result.unfinished == 0 and result.handovers_s == [60.0]
    assert result.teams["b"].reclaims == 1
    assert result.teams["b"].reclaimed_gpu_s == 2 * (60.0 + 60.0)  # the 2-GPU gang's checkpoint and restart


def test_a_gang_whose_work_begins_at_second_0_is_predicted_to_end_from_then() -> None:
    # A requeued gang resumed a minute before second 0.0 of its trace restores its checkpoint until 0.0, then has
    # ten minutes of work: it gives its GPUs back in eleven minutes, not ten (0.0 is not 'now').
    run = _Run(TeamJob("b", "b0", 2, -3600.0, 3600.0), left_s=600.0, started_s=-3600.0, running_since=0.0)
    assert _releases([run], now=-60.0) == ((660.0, 2),)
    assert _team_releases([run], now=-60.0) == (("b", 660.0, 2),)
