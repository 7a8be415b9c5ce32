"""Names of Channels groups and of the live feed's Redis keys, built in one place."""

import hashlib

from django.conf import settings


def dirty_nodes_key() -> str:
    """The Redis set of "cluster_id:node_id" waiting for the next live delta."""
    return f"{settings.REDIS_PREFIX}:live:dirty"


def cluster_group(cluster_id: int) -> str:
    return f"cluster-{cluster_id}"


def user_group(user_id: int) -> str:
    """Every live socket of one user: told when a role of theirs is removed."""
    return f"user-{user_id}"


def session_group(session_key: str) -> str:
    """Every live socket of one login (session): told when it ends. The key is hashed: group
    names are Redis keys, and a session key there would be a login for whoever reads them."""
    return f"session-{hashlib.sha256(session_key.encode()).hexdigest()[:32]}"


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def cluster_seq_key(cluster_id: int) -> str:
    """Counter numbering the live messages of a cluster, so a client can see a gap."""
    return f"{settings.REDIS_PREFIX}:live:seq:{cluster_id}"
