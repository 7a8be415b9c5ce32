"""A fleet for the overview tests: 4,096 nodes × 8 GPUs (32,768 GPUs) with their latest
health. Half of them say their rack (node_info `rack`: 64 racks of 32), the other half do
not (blocks of OVERVIEW_BLOCK_NODES by name). One GPU runs hot (critical), one node is
cordoned."""

from __future__ import annotations

from django.utils import timezone

from apps.clusters.models import Cluster, Node
from apps.telemetry.models import NodeHealth

NODES, GPUS = 4096, 8
RACKED = NODES // 2
HOT_NODE, HOT_GPU = "node-3000", 3  # not racked: in the block "node-2976 … node-3007"
CORDONED = "node-0040"  # rack r01
HOT_BLOCK = "node-2976 … node-3007"


def node_name(index: int) -> str:
    return f"node-{index:04d}"


def fleet(cluster_name: str) -> Cluster:
    cluster = Cluster.objects.create(name=cluster_name)
    now = timezone.now()
    nodes = Node.objects.bulk_create(
        Node(
            cluster=cluster, name=node_name(i), last_seen=now,
            info={"gpus": GPUS, **({"rack": f"r{i // 32:02d}"} if i < RACKED else {})},
            state="cordoned" if node_name(i) == CORDONED else "active",
        )
        for i in range(NODES)
    )  # fmt: skip
    NodeHealth.objects.bulk_create(
        NodeHealth(
            node=node, gpu=gpu, ts=now,
            values={"gpu.util": 95.0,
                    "gpu.temp_c": 90.0 if (node.name, gpu) == (HOT_NODE, HOT_GPU) else 60.0},
        )
        for node in nodes
        for gpu in range(-1, GPUS)
    )  # fmt: skip
    return cluster
