"""The fair-share policies on hand-made cases (weights, quotas, limits, borrowing, reclaim, decay, budgets)
and, as properties, that no team below its share is starved and that the fleet is never over-admitted."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import kinds
from policies.fair_share import (
    FairShareRequest,
    QueuedGang,
    Reclaim,
    Team,
    TeamUsage,
    owed_shares,
    water_fill,
    weighted_fair_share,
)
from policies.fair_share_baselines import fifo, static_quota


def gangs(team: str, count: int, gpus: int = 1, priority: int = 500, start: int = 0) -> tuple[QueuedGang, ...]:
    return tuple(QueuedGang(f"{team}{i}", team, gpus, priority, start + i) for i in range(count))


def test_registered_by_name_with_the_baselines() -> None:
    assert kinds.fair_share.default_name() == "weighted_fair_share"
    assert kinds.fair_share.get("fifo") is fifo and kinds.fair_share.get("static_quota") is static_quota
    assert kinds.choose().fair_share is weighted_fair_share


def test_water_fill_gives_floors_then_weights_and_passes_on_what_a_capped_claim_cannot_take() -> None:
    given = water_fill(10, [("a", 1, 0, 100), ("b", 3, 0, 100)])
    assert given == pytest.approx({"a": 2.5, "b": 7.5})
    given = water_fill(10, [("a", 1, 0, 100), ("b", 3, 0, 2)])  # b wants only 2: a gets the rest
    assert given == pytest.approx({"a": 8.0, "b": 2.0})
    given = water_fill(10, [("a", 1, 6, 100), ("b", 1, 0, 100)])  # a's quota past its weighted half
    assert given == pytest.approx({"a": 6.0, "b": 4.0})
    given = water_fill(10, [("a", 1, 3, 100), ("b", 1, 0, 100)])  # a quota below the weighted share
    assert given == pytest.approx({"a": 5.0, "b": 5.0})
    given = water_fill(4, [("a", 1, 6, 100), ("b", 1, 2, 100)])  # quotas past the fleet: scaled alike
    assert given == pytest.approx({"a": 3.0, "b": 1.0})


def test_two_equal_teams_split_the_fleet_and_the_owner_reclaims_what_was_borrowed() -> None:
    request = FairShareRequest(4, (Team("a"), Team("b")), (TeamUsage("a", 4, 4 * 3600.0),), gangs("b", 2, start=10))
    decision = weighted_fair_share(request)
    assert dict(decision.owed) == pytest.approx({"a": 2.0, "b": 2.0})
    assert decision.admit == ()
    assert decision.reclaims == (Reclaim("b0", 1, ("a",)), Reclaim("b1", 1, ("a",)))
    assert decision.reason_of("b0") == "waiting: reclaiming 1 GPU from team a"

    # FIFO and static quotas never take back: b waits for a's jobs to end.
    assert fifo(request).reclaims == () and fifo(request).reason_of("b0") == "waiting: for GPUs"
    assert static_quota(request).reclaims == ()


def test_a_team_borrows_what_others_leave_unused_and_stops_at_its_limit() -> None:
    request = FairShareRequest(8, (Team("a", limit_gpus=6), Team("b")), (), gangs("a", 8))
    decision = weighted_fair_share(request)
    assert decision.admit == tuple(f"a{i}" for i in range(6))  # b has no work: a borrows up to its limit
    assert decision.reason_of("a6") == "waiting: team a at its limit of 6 GPUs"
    # A static quota lends nothing: a gets its half.
    assert static_quota(request).admit == tuple(f"a{i}" for i in range(4))


def test_weights_decide_the_share_and_the_order() -> None:
    teams = (Team("a", weight=3), Team("b", weight=1))
    request = FairShareRequest(8, teams, (), gangs("a", 10) + gangs("b", 10, start=100))
    decision = weighted_fair_share(request)
    assert dict(decision.owed) == pytest.approx({"a": 6.0, "b": 2.0})
    admitted = [j[0] for j in decision.admit]
    assert admitted.count("a") == 6 and admitted.count("b") == 2
    # FIFO: whoever came first takes everything.
    assert [j[0] for j in fifo(request).admit] == ["a"] * 8


def test_a_quota_is_guaranteed_beyond_the_weights() -> None:
    teams = (Team("a"), Team("b", quota_gpus=6))
    decision = weighted_fair_share(FairShareRequest(8, teams, (), gangs("a", 10) + gangs("b", 10, start=100)))
    assert dict(decision.owed) == pytest.approx({"a": 2.0, "b": 6.0})
    assert sum(j.startswith("b") for j in decision.admit) == 6


def test_a_parent_share_is_divided_among_its_children() -> None:
    teams = (Team("research", weight=1), Team("nlp", parent="research"), Team("vision", parent="research"),
             Team("prod", weight=1))
    queued = gangs("nlp", 8) + gangs("vision", 8, start=10) + gangs("prod", 8, start=20)
    owed = owed_shares(FairShareRequest(8, teams, (), queued))
    assert owed == pytest.approx({"nlp": 2.0, "vision": 2.0, "prod": 4.0})
    # The parent's limit holds its children together.
    limited = (Team("research", limit_gpus=3), Team("nlp", parent="research"), Team("vision", parent="research"))
    decision = weighted_fair_share(FairShareRequest(8, limited, (), gangs("nlp", 4) + gangs("vision", 4, start=10)))
    assert len(decision.admit) == 3
    assert "team research at its limit of 3 GPUs" in (decision.reason_of("nlp3") or decision.reason_of("vision3") or "")


def test_recent_usage_decides_between_teams_equally_far_from_their_share() -> None:
    # Both hold nothing now; b used the fleet all morning, a was idle: a goes first and is not punished.
    usage = (TeamUsage("a", 0, 0.0), TeamUsage("b", 0, 50_000.0))
    request = FairShareRequest(1, (Team("a"), Team("b")), usage, gangs("b", 1) + gangs("a", 1, start=5))
    assert weighted_fair_share(request).admit == ("a0",)
    assert fifo(request).admit == ("b0",)


def test_priority_orders_within_a_team_and_inference_is_admitted_whatever_the_share() -> None:
    queued = (QueuedGang("low", "a", 1, 100, 0), QueuedGang("high", "a", 1, 500, 1),
              QueuedGang("serve", "a", 1, 1000, 2))
    request = FairShareRequest(2, (Team("a"), Team("b")), (TeamUsage("a", 1), TeamUsage("b", 1)), queued)
    decision = weighted_fair_share(request)
    assert "serve" in decision.admit and decision.admit[0] == "serve"
    assert decision.reason_of("high") is not None and decision.reason_of("low") is not None


def test_the_borrower_most_over_its_share_gives_back_first() -> None:
    usage = (TeamUsage("a", 5), TeamUsage("b", 3), TeamUsage("c", 0))
    queued = gangs("c", 2, gpus=2) + gangs("a", 1, start=9) + gangs("b", 1, start=9)
    request = FairShareRequest(8, (Team("a"), Team("b"), Team("c")), usage, queued)
    decision = weighted_fair_share(request)
    # Each is owed 8/3: c's first gang takes 2 back from a (3 over), its second would put c over.
    assert decision.reclaims == (Reclaim("c0", 2, ("a",)),)
    assert decision.reason_of("c1") == "waiting: team c over its share (holds 2 of 2.66667 GPUs owed)"


def test_fractional_shares_still_reclaim_for_a_team_holding_nothing() -> None:
    usage = (TeamUsage("a", 2), TeamUsage("b", 2), TeamUsage("c", 0))
    request = FairShareRequest(4, (), usage, gangs("a", 2) + gangs("b", 2, start=5) + gangs("c", 1, start=9))
    decision = weighted_fair_share(request)
    assert [r.job_id for r in decision.reclaims] == ["c0"]
    # c wants one GPU: owed 1, and a and b 1.5 each; a and b each hold half a GPU past theirs.
    assert decision.reclaims[0].from_teams in (("a",), ("b",))
    assert decision.reason_of("a0") == "waiting: team a over its share (holds 2 of 1.5 GPUs owed)"


def _kept(capacity: int, borrower_gpus: int) -> FairShareRequest:
    # a holds 2 and b holds 2; a's next gang (4 GPUs) would take a past its share, the one after it (2) fits
    # in it. a used more GPUs lately, so b, whose gang would borrow too, is asked first.
    usage = (TeamUsage("a", 2, 1000.0), TeamUsage("b", 2, 0.0))
    queued = (QueuedGang("a0", "a", 4, 500, 0, runtime_s=3600.0), QueuedGang("a1", "a", 2, 500, 1, runtime_s=3600.0),
              QueuedGang("b0", "b", borrower_gpus, 500, 2, runtime_s=3600.0))
    return FairShareRequest(capacity, (Team("a"), Team("b")), usage, queued)


def test_a_borrower_takes_only_the_free_gpus_beyond_those_kept_for_gangs_within_their_share() -> None:
    # 8 GPUs, 4 each owed, 4 free. Asked first, b0 took all four and a1 waited "for GPUs" (every team within
    # its share), to take two of them back from b by a reclaim in the next step: a checkpoint for nothing,
    # and a held 2 of the 4 it was owed meanwhile (the 11.9 % window of benchmarks/fair_share.py, 96 GPUs,
    # seed 18). Now the 2 GPUs a1 takes within a's share are kept: b0 (4) does not fit the 2 beyond them.
    decision = weighted_fair_share(_kept(8, 4))
    assert decision.admit == ("a1",)
    assert decision.reclaims == ()
    assert decision.reason_of("b0") == \
        "waiting: 2 of the free GPUs are kept for the waiting jobs of teams within their share"
    # On 10 GPUs (5 owed each, 6 free) b0 fits beyond the 2 kept for a1 and borrows: both start.
    assert weighted_fair_share(_kept(10, 4)).admit == ("b0", "a1")


@pytest.mark.parametrize(("left", "cost", "admitted"), [
    (10.0, 9.99, True), (10.0, 10.0, True), (10.0, 10.01, False), (0.0, 0.0, False), (-3.0, 0.0, False),
    (None, 1e9, True),
], ids=["under", "exactly-at", "just-over", "spent", "overspent", "not-enforced"])
def test_budgets_at_the_boundary(left: float | None, cost: float, admitted: bool) -> None:
    gang = QueuedGang("j", "a", 1, 500, 0, predicted_cost=cost)
    request = FairShareRequest(4, (), (TeamUsage("a", 0, budget_left=left),), (gang,))
    for policy in (weighted_fair_share, fifo, static_quota):
        decision = policy(request)
        assert (decision.admit == ("j",)) is admitted
        if not admitted:
            assert (decision.reason_of("j") or "").startswith("waiting: budget: team a has $")


def test_a_budget_counts_every_job_it_admits() -> None:
    queued = tuple(QueuedGang(f"j{i}", "a", 1, 500, i, predicted_cost=4.0) for i in range(3))
    decision = weighted_fair_share(FairShareRequest(None, (), (TeamUsage("a", 0, budget_left=10.0),), queued))
    assert decision.admit == ("j0", "j1") and "budget" in (decision.reason_of("j2") or "")


def test_unbounded_fleet_admits_all_within_limits() -> None:
    queued = gangs("a", 3) + gangs("b", 3)
    decision = weighted_fair_share(FairShareRequest(None, (Team("a", limit_gpus=2),), (), queued))
    assert len(decision.admit) == 5


@pytest.mark.parametrize("bad", [
    lambda: Team("a", weight=-1), lambda: Team("a", weight=math.nan), lambda: Team("a", quota_gpus=-1),
    lambda: FairShareRequest(-1, (), (), ()), lambda: FairShareRequest(1, (), (), (), half_life_s=math.inf),
    lambda: FairShareRequest(1, (), (), (), team_releases=(("a", -1.0, 1),)),
    lambda: FairShareRequest(1, (), (), (), team_releases=(("a", math.nan, 1),)),
    lambda: FairShareRequest(1, (), (), (), team_releases=(("a", 60.0, -1),)),
])
def test_a_malformed_request_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        bad()  # type: ignore[operator]


TEAM_NAMES = ("a", "b", "c", "d")


@st.composite
def situations(draw: st.DrawFn) -> FairShareRequest:
    capacity = draw(st.integers(1, 32))
    teams = tuple(Team(n, weight=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))) for n in TEAM_NAMES)
    held_left = capacity
    usage = []
    for name in TEAM_NAMES:
        held = draw(st.integers(0, held_left))
        held_left -= held
        usage.append(TeamUsage(name, held, draw(st.floats(0, 1e6))))
    queued = []
    for name in TEAM_NAMES:
        for i in range(draw(st.integers(0, 6))):
            priority, order = draw(st.sampled_from([100, 500])), draw(st.integers(0, 99))
            runtime = draw(st.one_of(st.none(), st.floats(60, 36000)))
            queued.append(QueuedGang(f"{name}{i}", name, 1, priority, order, runtime_s=runtime))
    # Predicted ends for some of the held GPUs: reservations come and go with them.
    # Sometimes with the team of each end, so that the reservation counts what each team takes again.
    by_team = tuple((u.team, draw(st.floats(0, 36000)), 1) for u in usage
                    for _ in range(draw(st.integers(0, u.held_gpus))))
    releases = tuple((in_s, gpus) for _, in_s, gpus in by_team)
    team_releases = by_team if draw(st.booleans()) else ()
    return FairShareRequest(capacity, teams, tuple(usage), tuple(queued), releases=releases,
                            team_releases=team_releases)


@settings(max_examples=400, deadline=None)
@given(situations())
def test_no_team_below_its_share_is_starved(request: FairShareRequest) -> None:
    decision = weighted_fair_share(request)
    owed = dict(decision.owed)
    held = {u.team: u.held_gpus for u in request.usage}
    served = set(decision.admit) | {r.job_id for r in decision.reclaims}
    for team in TEAM_NAMES:
        mine = [g.job_id for g in request.queued if g.team == team]
        if mine and held[team] + 1 <= owed.get(team, 0.0) + 1e-9:
            assert served & set(mine), (team, decision)


@settings(max_examples=400, deadline=None)
@given(situations())
def test_the_fleet_is_never_over_admitted_and_reclaims_only_take_from_teams_over_their_share(
        request: FairShareRequest) -> None:
    decision = weighted_fair_share(request)
    queued = {g.job_id: g for g in request.queued}
    held = {u.team: u.held_gpus for u in request.usage}
    free = request.capacity_gpus - sum(held.values())  # type: ignore[operator]
    assert sum(queued[j].gpus for j in decision.admit) <= free
    owed = dict(decision.owed)
    for reclaim in decision.reclaims:
        assert all(held[t] > owed[t] for t in reclaim.from_teams)
    for policy in (fifo, static_quota):
        assert sum(queued[j].gpus for j in policy(request).admit) <= free
    decided = set(decision.admit) | {j for j, _ in decision.waits}
    assert decided == set(queued)


def _reserving(**extra: object) -> FairShareRequest:
    # b's 8-GPU gang waits longest; a's 4 GPUs come free in 10 minutes; c (a tiny share) can only borrow.
    queued = (QueuedGang("b0", "b", 8, 500, 0, runtime_s=3600.0), QueuedGang("c0", "c", 1, 500, 1, runtime_s=300.0),
              QueuedGang("c1", "c", 1, 500, 2, runtime_s=7200.0), QueuedGang("c2", "c", 1, 500, 3),
              QueuedGang("d0", "d", 2, 500, 4, runtime_s=7200.0))
    teams = (Team("a"), Team("b"), Team("c", weight=0.01), Team("d"))
    return FairShareRequest(8, teams, (TeamUsage("a", 4),), queued, **extra)  # type: ignore[arg-type]


def test_the_gang_waiting_longest_gets_a_reservation_that_only_short_borrowers_pass() -> None:
    decision = weighted_fair_share(_reserving(releases=((600.0, 4),)))
    # c0 ends before the 8 GPUs are free for b0; c1 would run past it, c2 has no estimate; d0 is within d's share.
    assert set(decision.admit) == {"c0", "d0"}
    assert decision.reason_of("c1") == decision.reason_of("c2") == \
        "waiting: the free GPUs are reserved for b0 (8 GPUs), which starts first, in about 10 min"
    # Without predicted ends nothing can be reserved: the gangs that fit start (d's share first), as before.
    assert set(weighted_fair_share(_reserving()).admit) == {"d0", "c0", "c1"}
    assert set(fifo(_reserving(releases=((600.0, 4),))).admit) == {"c0", "c1", "c2"}  # FIFO reserves nothing


def _reserving_by_team(**extra: object) -> FairShareRequest:
    # b's 10-GPU gang waits longest and is larger than b's whole share: it can only borrow. a holds 4 of its 6
    # (2 come free in 10 minutes, 2 in two hours) and has 2 more waiting; c (a tiny share) can only borrow.
    usage = (TeamUsage("a", 4),)
    queued = (QueuedGang("b0", "b", 10, 500, 0, runtime_s=3600.0), QueuedGang("a1", "a", 2, 500, 1, runtime_s=7200.0),
              QueuedGang("c0", "c", 2, 500, 2, runtime_s=1200.0), QueuedGang("c1", "c", 2, 500, 3, runtime_s=20000.0))
    teams = (Team("a"), Team("b"), Team("c", weight=0.01))
    return FairShareRequest(13, teams, usage, queued, releases=((600.0, 2), (7200.0, 2)),
                            **extra)  # type: ignore[arg-type]


def test_with_each_end_s_team_the_reservation_counts_what_the_teams_take_again_for_their_share() -> None:
    # By the ends alone b0 would start in 10 minutes: a short borrower running 20 minutes is held back, and
    # the 7 GPUs a1 leaves stay idle, though a takes its 2 GPUs back for a1 and b0 cannot start then.
    blind = weighted_fair_share(_reserving_by_team())
    assert blind.admit == ("a1",)
    assert blind.reason_of("c0") == "waiting: the free GPUs are reserved for b0 (10 GPUs), which starts first, " \
                                    "in about 10 min"
    # Knowing whose GPUs come free when: a keeps its share (a1 is within it), so b0's 10 GPUs are there in two
    # hours; c0 ends before then and fills idle GPUs; c1 would run past it and waits.
    decision = weighted_fair_share(_reserving_by_team(team_releases=(("a", 600.0, 2), ("a", 7200.0, 2))))
    assert decision.admit == ("a1", "c0")
    assert decision.reason_of("c1") == "waiting: the free GPUs are reserved for b0 (10 GPUs), which starts " \
                                       "first, in about 120 min"
    assert (decision.reason_of("b0") or "").startswith("waiting: its 10 GPUs are more than team b's share")


def test_a_big_gang_is_not_starved_by_backfill_when_its_gpus_come_free() -> None:
    # Later a's gangs have ended but one of 2 GPUs: b0's 10 GPUs are free, and b0 is past b's share (9.9 of
    # 12). b used more GPUs lately than c, so c's gangs (past c's tiny share too) are asked first: any of them
    # would borrow a GPU b0 needs.
    queued = (QueuedGang("b0", "b", 10, 500, 0, runtime_s=3600.0),
              QueuedGang("c1", "c", 2, 500, 3, runtime_s=20000.0), QueuedGang("c2", "c", 1, 500, 4, runtime_s=60.0))
    teams = (Team("a"), Team("b"), Team("c", weight=0.01))
    usage = (TeamUsage("a", 2, 7200.0), TeamUsage("b", 0, 1e6))
    decision = weighted_fair_share(FairShareRequest(12, teams, usage, queued, releases=((7200.0, 2),),
                                                    team_releases=(("a", 7200.0, 2),)))
    assert decision.admit == ("b0",)
    assert decision.reason_of("c1") == decision.reason_of("c2") == \
        "waiting: the free GPUs are reserved for b0 (10 GPUs), which starts first, in about 0 min"
    # By the ends alone, a gang that fits now gets no reservation: c's gangs borrow first and b0 waits again.
    blind = weighted_fair_share(FairShareRequest(12, teams, usage, queued, releases=((7200.0, 2),)))
    assert blind.admit == ("c1", "c2")


def test_a_gang_larger_than_its_share_borrows_only_as_the_gang_waiting_longest() -> None:
    # b0 (7 GPUs) waits longest; a's 2 GPUs have no predicted end, d's one ends in 10 minutes: no start can be
    # named for b0. c0 (4 GPUs, more than c's share of 2.5) fits the 5 free GPUs but would only borrow them.
    teams = (Team("a"), Team("b"), Team("c"), Team("d"))
    usage = (TeamUsage("a", 2), TeamUsage("d", 1))
    b0, c0 = QueuedGang("b0", "b", 7, 500, 0, runtime_s=3600.0), QueuedGang("c0", "c", 4, 500, 1, runtime_s=7200.0)
    request = FairShareRequest(8, teams, usage, (b0, c0), releases=((600.0, 1),), team_releases=(("d", 600.0, 1),))
    decision = weighted_fair_share(request)
    assert decision.admit == ()
    assert decision.reason_of("c0") == \
        "waiting: its 4 GPUs are more than team c's share of 2.5; it borrows them once it is the job waiting longest"
    # By the ends alone (no teams), it borrows as before.
    assert weighted_fair_share(FairShareRequest(8, teams, usage, (b0, c0), releases=((600.0, 1),))).admit == ("c0",)
    # Once it is the gang waiting longest, it starts.
    alone = FairShareRequest(8, teams, usage, (c0,), releases=((600.0, 1),), team_releases=(("d", 600.0, 1),))
    assert weighted_fair_share(alone).admit == ("c0",)


def test_a_gang_larger_than_the_fleet_holds_no_reservation_that_keeps_others_waiting() -> None:
    # b0 can never start on 8 GPUs; c0, next, is the one the reservation is for, and starts.
    teams = (Team("a"), Team("b"), Team("c"), Team("d"))
    usage = (TeamUsage("a", 2), TeamUsage("d", 1))
    queued = (QueuedGang("b0", "b", 12, 500, 0, runtime_s=3600.0), QueuedGang("c0", "c", 4, 500, 1, runtime_s=7200.0))
    request = FairShareRequest(8, teams, usage, queued, releases=((600.0, 1),), team_releases=(("d", 600.0, 1),))
    assert weighted_fair_share(request).admit == ("c0",)


def test_ends_of_a_team_holding_nothing_or_more_gpus_than_it_holds_free_nothing_it_does_not_hold() -> None:
    # a holds the whole fleet; the ends name a team holding nothing, and more of a's GPUs than it holds.
    teams = (Team("a"), Team("b"))
    queued = (QueuedGang("b0", "b", 4, 500, 0, runtime_s=600.0), QueuedGang("a1", "a", 1, 500, 1, runtime_s=60.0))
    for ends in ((("ghost", 0.0, 100),), (("a", 600.0, 100),)):
        request = FairShareRequest(8, teams, (TeamUsage("a", 8),), queued, releases=tuple((s, n) for _, s, n in ends),
                                   team_releases=ends)
        decision = weighted_fair_share(request)
        assert decision.admit == ()
        assert decision.reclaims == (Reclaim("b0", 4, ("a",)),)  # b's share is taken back, as without ends


def test_a_quota_per_gpu_type_is_guaranteed_per_type() -> None:
    # a is owed 1 GPU of 4 by weight and holds 2 V100s; its quota of 2 A100s still holds.
    teams = (Team("a", quota_gpus=2, type_quotas=(("A100", 2),)), Team("b", weight=3))
    usage = (TeamUsage("a", 2, held_by_type=(("V100", 2),)), TeamUsage("b", 2, held_by_type=(("A100", 2),)))
    queued = (QueuedGang("a-v", "a", 1, 500, 0, gpu_type="V100"), QueuedGang("a-a", "a", 1, 500, 1, gpu_type="A100"),
              QueuedGang("b-v", "b", 1, 500, 2, gpu_type="V100"))
    decision = weighted_fair_share(FairShareRequest(4, teams, usage, queued))
    assert decision.reclaims == (Reclaim("a-a", 1, ("b",)),)  # an A100 of b's, though a is past its share
    assert decision.reason_of("a-a") == "waiting: reclaiming 1 A100 GPU from team b"
    assert (decision.reason_of("a-v") or "").startswith("waiting: team a over")
    # A total quota of 2 alone gives a nothing more: it holds 2 already.
    total = weighted_fair_share(FairShareRequest(4, (Team("a", quota_gpus=2), Team("b", weight=3)), usage, queued))
    assert total.reclaims == () and (total.reason_of("a-a") or "").startswith("waiting: team a over its share")


def test_a_type_quota_takes_back_only_that_type_and_not_from_a_team_within_its_own() -> None:
    teams = (Team("a", quota_gpus=2, type_quotas=(("A100", 2),)), Team("b", quota_gpus=2, type_quotas=(("A100", 2),)),
             Team("c"))
    usage = (TeamUsage("b", 2, held_by_type=(("A100", 2),)), TeamUsage("c", 4, held_by_type=(("V100", 4),)))
    queued = (QueuedGang("a0", "a", 1, 500, 0, gpu_type="A100"),)
    decision = weighted_fair_share(FairShareRequest(6, teams, usage, queued))
    # b holds its own A100 quota, c holds only V100s: no A100 to take back.
    assert decision.reclaims == ()
    assert decision.reason_of("a0") == ("waiting: for A100 GPUs (within team a's A100 quota; every team holding "
                                        "them is within its own)")
    # b holds 3 A100s (1 past its quota), c 4 GPUs, 1 an A100 (1 past its share of 3): c gives back first.
    usage = (TeamUsage("b", 3, held_by_type=(("A100", 3),)), TeamUsage("c", 4, held_by_type=(("A100", 1), ("V100", 3))))
    decision = weighted_fair_share(FairShareRequest(7, teams, usage, queued))
    assert decision.reclaims == (Reclaim("a0", 1, ("c",)),)


def test_a_negative_type_quota_is_refused() -> None:
    with pytest.raises(ValueError, match=r"quota_gpus\.A100 must be >= 0"):
        Team("a", type_quotas=(("A100", -1),))
