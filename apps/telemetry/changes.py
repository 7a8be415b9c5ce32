"""Which span of which node got samples, for readers that keep a window between passes.

Ingest's store step records, in its transaction, each node's (first ts, last ts) of the
samples it stored in the change log `telemetry_samplechange`, read by transaction-id
watermark (apps.core.changes says why) by the detectors' windows kept by each periodic
worker (apps.alerts.selectors.kept_telemetry). Compaction rewrites chunks without changing
their points, so it records nothing.
"""

from __future__ import annotations

import numpy as np

from apps.core.changes import CHANGES_KEEP_S, ChangeLog, ChangeSnapshot
from apps.core.copy import UNIX_TO_PG_EPOCH_S
from apps.core.db import server_cursor
from apps.telemetry.chunk_copy import SeriesRanges

SAMPLE_CHANGES = ChangeLog("telemetry_samplechange", "telemetry_samplechangehorizon")


def samples_mark_changed(*, ranges: SeriesRanges) -> None:
    """Record each node's span of the series just written (`samples_store`'s ranges); call
    in the transaction that wrote them. One row a node, however many series it sent."""
    if not len(ranges.node_ids):
        return
    order = np.argsort(ranges.node_ids, kind="stable")
    nodes = ranges.node_ids[order]
    firsts = np.flatnonzero(np.append(True, nodes[1:] != nodes[:-1]))
    t0 = np.minimum.reduceat(ranges.t0s[order], firsts) / 1e6 + UNIX_TO_PG_EPOCH_S
    t1 = np.maximum.reduceat(ranges.t1s[order], firsts) / 1e6 + UNIX_TO_PG_EPOCH_S
    with server_cursor() as cursor:
        cursor.execute(
            "INSERT INTO telemetry_samplechange (node_id, t0, t1)"
            " SELECT * FROM unnest(%b::int4[], %b::float8[], %b::float8[])",
            [nodes[firsts].tolist(), t0.tolist(), t1.tolist()],
        )


def sample_changes_snapshot() -> ChangeSnapshot:
    """Take before reading anything the changes will be compared with."""
    return SAMPLE_CHANGES.snapshot()


def sample_changes_since(*, node_ids: list[int], xid: int) -> dict[int, tuple[float, float]]:
    """node id → the span (first ts, last ts) of every sample of it written by transactions
    with ids at or above `xid`: one span a node, gaps included."""
    if not node_ids:
        return {}
    rows = SAMPLE_CHANGES.rows_since(
        columns="node_id, min(t0), max(t1)", key="node_id", ids=node_ids, xid=xid,
        tail="GROUP BY node_id",
    )  # fmt: skip
    return {node_id: (t0, t1) for node_id, t0, t1 in rows}


def sample_changes_prune(*, keep_s: float = CHANGES_KEEP_S) -> None:
    """Drop the change log's rows older than `keep_s`, raising the horizon past them."""
    SAMPLE_CHANGES.prune(keep_s=keep_s)
