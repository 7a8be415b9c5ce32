from django.db import connection

from apps.clusters.models import AgentToken, Cluster
from apps.clusters.services import token_digest


def token_authenticate(*, secret: str) -> AgentToken | None:
    """The live (not revoked) token with this secret, with its cluster, or None."""
    if not secret:
        return None
    # On every ingest request: one indexed lookup in plain SQL (the ORM's query compilation
    # cost a fifth of the ingest view's CPU).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, cluster_id, name, nodes FROM clusters_agenttoken"
            " WHERE digest = %s AND revoked_at IS NULL",
            [token_digest(secret)],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return AgentToken(id=row[0], cluster_id=row[1], name=row[2], nodes=row[3])


def cluster_list() -> list[Cluster]:
    return list(Cluster.objects.order_by("name"))
