"""Checks shared by the tests that kill a broker mid-migration: what the store must show afterwards."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import timedelta

from broker.store.tables import ClusterRow, JobRow, LedgerRow


def assert_one_cluster_per_zone_and_whole_ledger(job: JobRow, clusters: Sequence[ClusterRow],
                                                 ledger: Sequence[LedgerRow]) -> None:
    used = [c for c in clusters if c.up_at is not None]
    assert sorted(c.zone for c in used) == sorted(set(job.zones))  # one cluster per zone used
    # every cluster ended: torn down, or refused at launch (a failed launch is a record, not a cluster)
    assert all(c.state in ("TERMINATED", "FAILED") for c in clusters), [(c.id, c.state) for c in clusters]
    for cluster in used:
        minutes = sorted({r.minute for r in ledger if r.cluster_id == cluster.id})
        # No gap, no overlap: from the launch, every following clock minute exactly once, to the end.
        assert minutes and minutes[0] == cluster.created_at
        assert all(b.second == 0 and b.microsecond == 0 and timedelta(0) < b - a <= timedelta(minutes=1)
                   for a, b in itertools.pairwise(minutes))
        assert cluster.metered_until == cluster.terminated_at


def ledger_outside_cluster_life(clusters: Sequence[ClusterRow], ledger: Sequence[LedgerRow]) -> list[str]:
    """Ledger rows billed before a cluster's launch or from its end on; ended clusters metered past their end."""
    by_id = {c.id: c for c in clusters}
    wrong = []
    for row in ledger:
        cluster = by_id[row.cluster_id]
        ended = cluster.terminated_at
        if row.minute < cluster.created_at or (ended is not None and row.minute >= ended):
            end = f"{cluster.terminated_at:%H:%M:%S}" if cluster.terminated_at else "now"
            wrong.append(f"{row.cluster_id} billed {row.minute:%H:%M:%S} ({row.holder}) outside"
                         f" {cluster.created_at:%H:%M:%S}..{end}")
    for cluster in clusters:
        if cluster.terminated_at is not None and cluster.metered_until is not None \
                and cluster.metered_until > cluster.terminated_at:
            wrong.append(f"{cluster.id} metered until {cluster.metered_until:%H:%M:%S},"
                         f" after its end {cluster.terminated_at:%H:%M:%S}")
    return wrong
