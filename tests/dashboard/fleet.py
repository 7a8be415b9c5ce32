"""Fleets for the overview tests. fleet: 4,096 nodes × 8 GPUs (32,768 GPUs) with their latest
health. Half of them say their rack (node_info `rack`: 64 racks of 32), the other half do
not (blocks of OVERVIEW_BLOCK_NODES by name). One GPU runs hot (critical), one node is
cordoned. mixed_fleet: fewer nodes, in every state a tile and a block can take."""

from __future__ import annotations

from datetime import timedelta

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


# A mixed fleet (mixed_fleet): every way a node's tiles and block can come out.
MIXED_VALUES = [
    {"gpu.util": 95.0, "gpu.temp_c": 60.0, "gpu.mem_used_bytes": 60e9,
     "gpu.mem_total_bytes": 80e9, "gpu.throttle_reasons": 0.0},
    {"gpu.temp_c": 80.0}, {"gpu.temp_c": 79.99999}, {"gpu.temp_c": 85}, {"gpu.temp_c": 84.9},
    {"gpu.mem_used_bytes": 95.0, "gpu.mem_total_bytes": 100.0},  # exactly the ratio
    {"gpu.mem_used_bytes": 94.99, "gpu.mem_total_bytes": 100.0},
    {"gpu.mem_used_bytes": 5.0, "gpu.mem_total_bytes": 0.0}, {"gpu.mem_used_bytes": None},
    {"gpu.throttle_reasons": 8.0}, {"gpu.throttle_reasons": 1.0}, {"gpu.throttle_reasons": 8.9},
    {"gpu.throttle_reasons": -1.0}, {"gpu.throttle_reasons": float(2**60)},  # left to Python
    {"gpu.mem_used_bytes": 1.0, "gpu.mem_total_bytes": 1e-300},  # a ratio Postgres can't take
    {"gpu.temp_c": None}, {},
]  # fmt: skip
# node_info's rack: strings, an integer (a block), and what is no block (empty, a float, a
# bool, an integer past 64 bits: orjson reads a float)
MIXED_RACKS = ["r00", "r01", "r02", 7, "", 3.5, True, 2**70, None, None, None, None]
# "rack r01" sorts last of the nodes without a rack, alone in its block (116 nodes): a
# block named as the rack's
MIXED_NAMES = ["Node-B", "node-ä", "node-10", "node-9", "a … b", "rack r01", "node-z"]
# active, fresh nodes with their GPUs ok (but the last's GPU 1), each with an alert
ALERTED = range(30, 35)


def mixed_name(node: int) -> str:
    return MIXED_NAMES[node] if node < len(MIXED_NAMES) else f"node-{node - len(MIXED_NAMES):03d}"


def mixed_values(node: int, gpu: int) -> dict:
    if node in ALERTED:
        return {"gpu.temp_c": 85.0} if (node, gpu) == (ALERTED[-1], 1) else MIXED_VALUES[0]
    return MIXED_VALUES[(node * 7 + gpu) % len(MIXED_VALUES)]


def mixed_fleet(cluster_name: str, nodes: int = 116) -> Cluster:
    """A fleet of `nodes` nodes in every state (active, cordoned, draining, down by the
    scheduler, silent, never seen), with GPUs missing, past their claim or past MAX_GPUS,
    values at the rules' thresholds and outside what Postgres computes exactly, racks of
    every JSON type, names that sort differently by locale (one alone in a block named as
    a rack's, one holding the block separator), and open alerts of a GPU, of a node, of a
    rank and a heartbeat."""
    from apps.alerts.services import alerts_sync
    from detectors.types import Finding

    cluster = Cluster.objects.create(name=cluster_name)
    now = timezone.now()
    names = [mixed_name(i) for i in range(nodes)]
    states = ["active"] * 7 + ["cordoned", "draining", "down"]
    created = Node.objects.bulk_create(
        Node(
            cluster=cluster, name=name, state=states[i % len(states)],
            down_by="scheduler" if states[i % len(states)] == "down" else "",
            last_seen=None if i % 23 == 5 else now - timedelta(hours=1) if i % 19 == 4 else now,
            info={"gpus": [8, 8, 6, 100, "8", 2][i % 6],
                  **({} if MIXED_RACKS[i % 12] is None else {"rack": MIXED_RACKS[i % 12]})},
        )
        for i, name in enumerate(names)
    )  # fmt: skip
    rows = []
    for i, node in enumerate(created):
        if i % 17 == 3:
            continue  # no health at all
        gpus = [-1, *range([8, 7, 6, 3, 8, 2][i % 6])] + ([9] if i % 11 == 1 else [])
        rows += [
            NodeHealth(node=node, gpu=gpu, ts=now, values=mixed_values(i, gpu)) for gpu in gpus
        ]
    NodeHealth.objects.bulk_create(rows)
    # on nodes 30-34 (active, fresh, their GPUs ok but the last's GPU 1): alerts on tiles
    a, b, c, d, e = names[ALERTED.start : ALERTED.stop]
    findings = [
        Finding(kind="xid", subject=f"node:{a}/gpu:2", severity="critical", summary="XID",
                node=a, gpu=2),
        Finding(kind="ecc", subject=f"node:{b}", severity="warning", summary="ECC", node=b),
        Finding(kind="straggler", subject=f"run:r/rank:3/{c}", severity="critical",
                summary="a slow rank: colours no GPU", node=c, rank=3),
        Finding(kind="heartbeat", subject=f"node:{d}", severity="critical", summary="silent",
                node=d),
        Finding(kind="thermal", subject=f"node:{e}/gpu:1", severity="warning",
                summary="hot: its own colour is worse", node=e, gpu=1),
    ]  # fmt: skip
    alerts_sync(cluster=cluster, findings=findings, now=now.timestamp())
    return cluster
