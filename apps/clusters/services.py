import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.clusters.choices import NodeDownBy, NodeState
from apps.clusters.hostlist import pattern_compile
from apps.clusters.models import AgentToken, Cluster, Node
from apps.clusters.signals import agent_token_changed

TOKEN_PREFIX = "obt_"


def token_digest(secret: str) -> str:
    # Tokens are 256-bit random values, so a fast unsalted hash cannot be brute-forced;
    # it lets the ingest path look the token up by digest in one indexed query.
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def token_issue(
    *,
    cluster_name: str,
    name: str = "",
    nodes: Sequence[str] = (),
    actor: Any = None,
    request: Any = None,
) -> tuple[AgentToken, str]:
    """Create the cluster if needed and a new token; returns (token, secret).

    With `nodes` (names or hostlist patterns such as gpu-[001-128]) the token acts only as
    those nodes; without, for every node of the cluster. Raises PatternError for a pattern
    that names no node set. The secret is returned once and never stored. Announced
    (agent_token_changed, in this transaction: the audit log records it) as done by `actor`
    (None: the command line)."""
    for pattern in nodes:
        pattern_compile(pattern)
    cluster, _ = Cluster.objects.get_or_create(name=cluster_name)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = AgentToken.objects.create(
        cluster=cluster,
        name=name,
        prefix=secret[:10],
        digest=token_digest(secret),
        nodes=list(dict.fromkeys(nodes)),
    )
    _announce("issue", token, actor, request)
    return token, secret


@transaction.atomic
def token_revoke(*, token: AgentToken, actor: Any = None, request: Any = None) -> bool:
    """Revoke the token (the next request with it is refused); False if it already was.
    A revoke is announced like an issue."""
    revoked = AgentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    if revoked:
        _announce("revoke", token, actor, request)
    return bool(revoked)


def _announce(action: str, token: AgentToken, actor: Any, request: Any) -> None:
    plain = {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "nodes": list(token.nodes),  # none: cluster-wide
        "cluster_id": token.cluster_id,
        "cluster_name": token.cluster.name,
    }
    agent_token_changed.send(
        sender=AgentToken, action=action, token=plain, actor=actor, request=request
    )


# One statement for every node of a drain (a round trip per node was a tenth of a drain's
# Postgres time). Rows go in sorted order, so concurrent drains lock shared nodes in the same
# order (no deadlocks). `info` NULL means "not sent": a new node gets {}, a known node keeps
# its own (EXCLUDED holds only table columns, so the flag is read back from the input).
_NODES_TOUCH_SQL = """
WITH seen AS (
  SELECT * FROM unnest(%(clusters)s::int8[], %(names)s::text[], %(at)s::timestamptz[],
                       %(infos)s::jsonb[], %(agents)s::bool[])
    AS s(cluster_id, name, last_seen, info, has_agent)
)
INSERT INTO clusters_node AS n (cluster_id, name, last_seen, info, has_agent, state)
SELECT cluster_id, name, last_seen, coalesce(info, '{}'), has_agent, 'active'
FROM seen ORDER BY cluster_id, name
ON CONFLICT (cluster_id, name) DO UPDATE SET
  last_seen = GREATEST(n.last_seen, EXCLUDED.last_seen),
  has_agent = n.has_agent OR EXCLUDED.has_agent,
  state = CASE WHEN n.state = 'down' AND n.down_by <> 'scheduler' THEN 'active'
          ELSE n.state END,
  down_by = CASE WHEN n.state = 'down' AND n.down_by <> 'scheduler' THEN ''
            ELSE n.down_by END,
  info = CASE WHEN (SELECT s.info IS NOT NULL FROM seen s
                    WHERE s.cluster_id = EXCLUDED.cluster_id AND s.name = EXCLUDED.name)
         THEN EXCLUDED.info ELSE n.info END
RETURNING cluster_id, name, id
"""


def nodes_touch(
    *,
    seen: dict[tuple[int, str], tuple[datetime, dict | None]],
    agents: set[tuple[int, str]] | frozenset[tuple[int, str]] = frozenset(),
) -> dict[tuple[int, str], int]:
    """Register unknown nodes and set `last_seen` (and `info` when sent) of the others.

    `seen` maps (cluster_id, node name) to (received at, node_info or None); the nodes in
    `agents` sent a batch without a run (a node agent), and `has_agent` stays set once set.
    A `down` node that reports again is `active` (a cordoned or draining one stays so),
    unless the scheduler said it is down: then the scheduler's word brings it back.
    Returns (cluster_id, name) → node id."""
    from psycopg.types.json import Jsonb

    if not seen:
        return {}
    keys = sorted(seen)
    params = {
        "clusters": [cluster_id for cluster_id, _ in keys],
        "names": [name for _, name in keys],
        "at": [seen[key][0] for key in keys],
        "infos": [None if seen[key][1] is None else Jsonb(seen[key][1]) for key in keys],
        "agents": [key in agents for key in keys],
    }
    connection.ensure_connection()
    # server-side binding (apps.core.db, which this app sits below): psycopg prepares a
    # statement run this often, so the drain's Postgres backend plans it once
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(_NODES_TOUCH_SQL, params)
        return {(cluster_id, name): node_id for cluster_id, name, node_id in cursor.fetchall()}


def node_mark_down(*, node_id: int, by: str = NodeDownBy.HEARTBEAT, reason: str = "") -> bool:
    """An `active` node becomes `down`, out of run plans. `by` says who said so, and so what
    brings it back: the heartbeat (it went silent: back when it reports again, nodes_touch)
    or the scheduler (its state hook: back when the scheduler says it is up, node_mark_up).
    A cordoned or draining node keeps its state: a person's decision stands. The heartbeat
    takes over a node the scheduler marked down (the node's own silence is the stronger
    word: the scheduler saying it is up does not bring back a node nobody hears from).
    `reason` is the scheduler's (kept as down_reason). True when this call changed the node."""
    nodes = Node.objects.filter(pk=node_id)
    if by == NodeDownBy.HEARTBEAT:
        nodes = nodes.filter(
            Q(state=NodeState.ACTIVE) | Q(state=NodeState.DOWN, down_by=NodeDownBy.SCHEDULER)
        )
    else:
        nodes = nodes.filter(state=NodeState.ACTIVE)
    return bool(nodes.update(state=NodeState.DOWN, down_by=by, down_reason=reason))


def node_mark_up(*, node_id: int, by: str) -> bool:
    """A node that `by` marked down is `active` again (one marked down by the other source
    stays down). True when this call changed the node."""
    moved = Node.objects.filter(pk=node_id, state=NodeState.DOWN, down_by=by).update(
        state=NodeState.ACTIVE, down_by="", down_reason=""
    )
    return bool(moved)
