from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.utils.crypto import constant_time_compare

from apps.clusters.choices import NodeState
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
    nodes = list(
        nodes.only(
            "id", "cluster_id", "name", "state", "down_by", "down_reason", "cordon_reason",
            "last_seen", "info",
        )
    )  # fmt: skip
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
            "down_by": node.down_by,
            "reason": node_state_reason(node),
            "last_seen": node.last_seen.timestamp() if node.last_seen else None,
            "gpus": node.info.get("gpus"),
            "health": health[node.id],
        }
        for node in nodes
    ]


def node_state_reason(node: Node) -> str:
    """Why the node is out of run plans, in its owner's words: the scheduler's reason for a
    node it reports down, the operator's for a cordoned or draining one; "" otherwise."""
    if node.state == NodeState.DOWN:
        return node.down_reason
    return node.cordon_reason if node.state != NodeState.ACTIVE else ""


def session_user(*, session_key: str | None) -> Any:
    """The user this session still authenticates, or None: the session is gone (logout),
    expired, its user is inactive or deleted, or its password changed (session hash).
    Django's own check, read-only (Django would also flush a stale session)."""
    if not session_key:
        return None
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user_id, backend_path = session.get(SESSION_KEY), session.get(BACKEND_SESSION_KEY)
    if user_id is None or backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    user = load_backend(backend_path).get_user(get_user_model()._meta.pk.to_python(user_id))
    if user is None or not getattr(user, "is_active", False):
        return None  # ModelBackend already refuses inactive users; other backends may not
    stored = session.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    if not stored or not any(constant_time_compare(stored, h) for h in hashes):
        return None
    return user
