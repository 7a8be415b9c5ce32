"""A node's reads for its page: the node, whether it reports GPUs, its XID and ECC events,
and the runs and ranks that train on it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce

from apps.clusters.models import Cluster, Node
from apps.core.db_router import read_alias
from apps.ingest.models import InboxBatch
from apps.runs.models import RunEvent
from apps.runs.selectors import NODES_STEPS
from apps.telemetry.models import HOST_GPU, NodeHealth

NODE_EVENTS_MAX = 200
NODE_EVENT_KINDS = ("xid", "ecc")
NODE_RUNS_MAX = 50


def node_of(*, cluster: Cluster, name: str) -> Node | None:
    """The node, with `quarantined_batches`: how many of its batches the worker could not
    store and set aside (apps.ingest: they count in the node's health)."""
    quarantined = (
        InboxBatch.objects.filter(
            token__cluster_id=OuterRef("cluster_id"),
            node=OuterRef("name"),
            quarantined_at__isnull=False,
        )
        .order_by()
        .values("node")
        .annotate(count=Count("id"))
        .values("count")
    )
    return (
        Node.objects.filter(cluster=cluster, name=name)
        .annotate(quarantined_batches=Coalesce(Subquery(quarantined), 0))
        .first()
    )


def node_reports_gpus(node: Node) -> bool:
    """Whether the node claims GPUs (node_info.gpus) or sent a GPU's reading; a CPU-only
    node does neither. At most one query."""
    claimed = node.info.get("gpus") if isinstance(node.info, dict) else None
    if type(claimed) is int and claimed > 0:  # JSON: any type may be there
        return True
    return NodeHealth.objects.filter(node=node).exclude(gpu=HOST_GPU).exists()


def node_events(*, node: Node, limit: int = NODE_EVENTS_MAX) -> list[dict[str, Any]]:
    """The node's newest XID and ECC events."""
    events = RunEvent.objects.filter(node=node, kind__in=NODE_EVENT_KINDS).order_by("-ts", "-id")
    return [
        {
            "ts": event.ts.timestamp(),
            "at": event.ts,
            "kind": event.kind,
            "gpu": event.gpu,
            "code": event.data.get("code"),
            "count": event.data.get("count"),
            "message": event.data.get("message", ""),
        }
        for event in events[:limit]
    ]


# Per run of the cluster that stepped since %(since)s: the ranks that reported from this node
# over its last NODES_STEPS steps (a (run_id, step) index range per run, as runs.selectors
# reads a run's nodes), each with the GPU it named (step reports' optional `gpu`). The range
# is closed at last_step (no report is past it: runs_touch keeps the greatest) because the
# planner guesses a third of the table for an open range bound by another table's column,
# and the node is filtered outside it (OFFSET 0): else the planner read the node's every
# report through its node_id index (0.9 s for 12 hours of 8 ranks a second).
_NODE_RANKS = """
SELECT r.name, r.state, r.last_step_at, s.rank, max(s.gpu)
FROM runs_run r CROSS JOIN LATERAL (
    SELECT rank, gpu, node_id FROM runs_stepreport
    WHERE run_id = r.id AND step > r.last_step - %(steps)s AND step <= r.last_step OFFSET 0
) s
WHERE r.cluster_id = %(cluster)s AND r.last_step IS NOT NULL AND r.last_step_at >= %(since)s
  AND s.node_id = %(node)s
GROUP BY r.id, r.name, r.state, r.last_step_at, s.rank
ORDER BY r.last_step_at DESC, r.name, s.rank
"""


def node_runs(*, node: Node, since: float, limit: int = NODE_RUNS_MAX) -> list[dict[str, Any]]:
    """The runs that stepped since `since` with ranks on this node (newest step first):
    {"name", "state", "last_step_at", "ranks": [{"rank", "gpu"}]}. One query."""
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            _NODE_RANKS,
            {
                "steps": NODES_STEPS,
                "node": node.id,
                "cluster": node.cluster_id,
                "since": datetime.fromtimestamp(since, UTC),
            },
        )
        rows = cursor.fetchall()
    runs: dict[str, dict[str, Any]] = {}
    for name, state, last_step_at, rank, gpu in rows:
        run = runs.setdefault(
            name, {"name": name, "state": state, "last_step_at": last_step_at, "ranks": []}
        )
        run["ranks"].append({"rank": rank, "gpu": gpu})
    return list(runs.values())[:limit]
