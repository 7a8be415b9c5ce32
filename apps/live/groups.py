"""Names of Channels groups and of the live feed's Redis keys, built in one place."""

from django.conf import settings


def dirty_nodes_key() -> str:
    """The Redis set of "cluster_id:node_id" waiting for the next live delta."""
    return f"{settings.REDIS_PREFIX}:live:dirty"


def cluster_group(cluster_id: int) -> str:
    return f"cluster-{cluster_id}"


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def cluster_seq_key(cluster_id: int) -> str:
    """Counter numbering the live messages of a cluster, so a client can see a gap."""
    return f"{settings.REDIS_PREFIX}:live:seq:{cluster_id}"
