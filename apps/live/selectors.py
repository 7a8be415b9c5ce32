from importlib import import_module
from typing import Any

import orjson
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.db import connections
from django.utils.crypto import constant_time_compare

from apps.clusters.choices import NodeState
from apps.clusters.models import Cluster
from apps.core.db_router import read_alias
from apps.telemetry.models import HOST_GPU


def cluster_get(*, name: str) -> Cluster | None:
    return Cluster.objects.filter(name=name).first()


def node_health_list(
    *, cluster_id: int | None = None, node_ids: list[int] | None = None
) -> list[dict[str, Any]]:
    """Latest health of nodes (all of a cluster, or the given ids), as plain JSON.

    One query whatever the number of nodes: Postgres builds each node's health object, so
    4,096 nodes' 37 k health rows become no model instance (1.1 s of a fleet's overview,
    now ≈ 0.1 s). The times are date_part's float8, the very value of datetime.timestamp()
    (microseconds over 10⁶, correctly rounded either way)."""
    where, params = [], {"field": settings.OVERVIEW_BLOCK_FIELD or "", "host": HOST_GPU}
    if cluster_id is not None:
        where.append("n.cluster_id = %(cluster)s")
        params["cluster"] = cluster_id
    if node_ids is not None:
        where.append("n.id = ANY(%(ids)s::int8[])")
        params["ids"] = list(node_ids)
    sql = _NODE_HEALTH_SQL.format(where=" AND ".join(where) or "true")
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [
        {
            "id": node_id,
            "cluster_id": cluster,
            "node": name,
            "state": state,
            "down_by": down_by,
            "reason": node_state_reason(state, down_reason, cordon_reason),
            "last_seen": last_seen,
            "gpus": _loaded(gpus),
            # its block on a fleet's overview (apps.dashboard.selectors.blocks), if it says
            "block": _block_of(_loaded(block)),
            "health": _loaded(health) or {},
        }
        for (node_id, cluster, name, state, down_by, down_reason, cordon_reason, last_seen,
             gpus, block, health) in rows
    ]  # fmt: skip


# A node's health: {"host" | "<gpu>": {"ts": seconds, **values}} (the values win a "ts"
# of their own, as {"ts": ..., **values} would let them).
_NODE_HEALTH_SQL = """
SELECT n.id, n.cluster_id, n.name, n.state, n.down_by, n.down_reason, n.cordon_reason,
       date_part('epoch', n.last_seen), n.info -> 'gpus', n.info -> %(field)s, h.health
FROM clusters_node n
LEFT JOIN LATERAL (
    SELECT jsonb_object_agg(CASE WHEN gpu = %(host)s THEN 'host' ELSE gpu::text END,
                            jsonb_build_object('ts', date_part('epoch', ts)) || "values")::text
           AS health
    FROM telemetry_nodehealth WHERE node_id = n.id
) h ON true
WHERE {where}
ORDER BY n.name
"""


def _loaded(text: str | None) -> Any:
    # Django reads json and jsonb as text off a raw cursor (its own loaders: JSONField's)
    return orjson.loads(text) if text else None


def _block_of(value: Any) -> str | None:
    return str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None


def node_state_reason(state: str, down_reason: str, cordon_reason: str) -> str:
    """Why the node is out of run plans, in its owner's words: the scheduler's reason for a
    node it reports down, the operator's for a cordoned or draining one; "" otherwise."""
    if state == NodeState.DOWN:
        return down_reason
    return cordon_reason if state != NodeState.ACTIVE else ""


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
