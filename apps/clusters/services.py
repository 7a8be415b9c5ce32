import hashlib
import secrets
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from apps.clusters.models import AgentToken, Cluster

TOKEN_PREFIX = "obt_"


def token_digest(secret: str) -> str:
    # Tokens are 256-bit random values, so a fast unsalted hash cannot be brute-forced;
    # it lets the ingest path look the token up by digest in one indexed query.
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def token_issue(*, cluster_name: str, name: str = "") -> tuple[AgentToken, str]:
    """Create the cluster if needed and a new token; returns (token, secret).

    The secret is returned once and never stored."""
    cluster, _ = Cluster.objects.get_or_create(name=cluster_name)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = AgentToken.objects.create(
        cluster=cluster, name=name, prefix=secret[:10], digest=token_digest(secret)
    )
    return token, secret


def token_revoke(*, token: AgentToken) -> None:
    AgentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def nodes_touch(
    *,
    seen: dict[tuple[int, str], tuple[datetime, dict | None]],
    agents: set[tuple[int, str]] | frozenset[tuple[int, str]] = frozenset(),
) -> dict[tuple[int, str], int]:
    """Register unknown nodes and set `last_seen` (and `info` when sent) of the others.

    `seen` maps (cluster_id, node name) to (received at, node_info or None); the nodes in
    `agents` sent a batch without a run (a node agent), and `has_agent` stays set once set.
    Returns (cluster_id, name) → node id."""
    from psycopg.types.json import Jsonb

    rows = [
        (cluster_id, name, at, Jsonb(info or {}), (cluster_id, name) in agents, info is not None)
        for (cluster_id, name), (at, info) in sorted(seen.items())  # sorted: no deadlocks
    ]
    ids: dict[tuple[int, str], int] = {}
    with connection.connection.cursor() as cursor:
        for row in rows:
            cursor.execute(
                "INSERT INTO clusters_node (cluster_id, name, last_seen, info, has_agent, state)"
                " VALUES (%s, %s, %s, %s, %s, 'active')"
                " ON CONFLICT (cluster_id, name) DO UPDATE SET"
                "  last_seen = GREATEST(clusters_node.last_seen, EXCLUDED.last_seen),"
                "  has_agent = clusters_node.has_agent OR EXCLUDED.has_agent,"
                "  info = CASE WHEN %s THEN EXCLUDED.info ELSE clusters_node.info END"
                " RETURNING id",
                row,
            )
            ids[row[0], row[1]] = cursor.fetchone()[0]
    return ids
