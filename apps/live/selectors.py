from typing import Any

from apps.clusters.models import Cluster, Node
from apps.telemetry.models import HOST_GPU, NodeHealth


def cluster_get(*, name: str) -> Cluster | None:
    return Cluster.objects.filter(name=name).first()


def node_health_list(
    *, cluster_id: int | None = None, node_ids: list[int] | None = None
) -> list[dict[str, Any]]:
    """Latest health of nodes (all of a cluster, or the given ids), as plain JSON.

    Two queries whatever the number of nodes."""
    nodes = Node.objects.order_by("name")
    if cluster_id is not None:
        nodes = nodes.filter(cluster_id=cluster_id)
    if node_ids is not None:
        nodes = nodes.filter(id__in=node_ids)
    nodes = list(nodes.only("id", "cluster_id", "name", "state", "last_seen", "info"))
    health: dict[int, dict[str, Any]] = {node.id: {} for node in nodes}
    for row in NodeHealth.objects.filter(node_id__in=health.keys()).order_by("gpu"):
        key = "host" if row.gpu == HOST_GPU else str(row.gpu)
        health[row.node_id][key] = {"ts": row.ts.timestamp(), **row.values}
    return [
        {
            "id": node.id,
            "cluster_id": node.cluster_id,
            "node": node.name,
            "state": node.state,
            "last_seen": node.last_seen.timestamp() if node.last_seen else None,
            "gpus": node.info.get("gpus"),
            "health": health[node.id],
        }
        for node in nodes
    ]
