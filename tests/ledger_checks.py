"""Checks shared by the tests that kill a broker mid-migration: what the store must show afterwards."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from broker.store.tables import ClusterRow, JobRow, LedgerRow


def assert_one_cluster_per_zone_and_whole_ledger(job: JobRow, clusters: Sequence[ClusterRow],
                                                 ledger: Sequence[LedgerRow]) -> None:
    used = [c for c in clusters if c.up_at is not None]
    assert sorted(c.zone for c in used) == sorted(set(job.zones))  # one cluster per zone used
    # every cluster ended: torn down, or refused at launch (a failed launch is a record, not a cluster)
    assert all(c.state in ("TERMINATED", "FAILED") for c in clusters), [(c.id, c.state) for c in clusters]
    for cluster in used:
        # No gap, no overlap: from the launch, piece after piece (each inside one clock minute), to the end.
        assert any(r.cluster_id == cluster.id for r in ledger), cluster.id
        assert cluster.metered_until == cluster.terminated_at
    assert ledger_tiles_cluster_life(used, ledger) == []


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


def ledger_tiles_cluster_life(clusters: Sequence[ClusterRow], ledger: Sequence[LedgerRow]) -> list[str]:
    """Where the ledger of a metered cluster does not tile its life: every piece starts where the one
    before ended and lies inside one clock minute, a piece's rows add up to the cluster's GPUs, and
    the pieces run from its launch to where it is metered (an ended cluster's last piece may run on to
    the one-minute minimum, no further)."""
    wrong = []
    for cluster in clusters:
        rows = [r for r in ledger if r.cluster_id == cluster.id]
        if cluster.metered_until is None:
            continue
        pieces: dict[datetime, list[LedgerRow]] = {}
        for r in rows:
            pieces.setdefault(r.minute, []).append(r)
        at, total = cluster.created_at, float(cluster.num_nodes * cluster.gpus_per_node) or float(cluster.num_nodes)
        for n, (start, held) in enumerate(sorted(pieces.items())):
            seconds = {round(r.seconds, 6) for r in held}
            gpus = sum(r.gpus for r in held)
            if start != at or len(seconds) != 1 or abs(gpus - total) > 1e-6:
                wrong.append(f"{cluster.id} piece at {start:%H:%M:%S} (expected {at:%H:%M:%S}):"
                             f" seconds {sorted(seconds)}, {gpus} of {total} GPUs")
                break
            at = start + timedelta(seconds=seconds.pop())
            boundary = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
            last = n == len(pieces) - 1 and cluster.terminated_at is not None
            if at > boundary and not last:
                wrong.append(f"{cluster.id} piece at {start:%H:%M:%S} runs past its minute to {at:%H:%M:%S}")
        end = cluster.metered_until
        if cluster.terminated_at is not None:
            end = max(cluster.terminated_at, cluster.created_at + timedelta(minutes=1))
        if pieces and abs((at - end).total_seconds()) > 1e-3:
            wrong.append(f"{cluster.id} billed to {at:%H:%M:%S.%f}, expected to {end:%H:%M:%S.%f}")
    return wrong
