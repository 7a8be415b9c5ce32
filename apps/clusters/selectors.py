from apps.clusters.models import AgentToken, Cluster
from apps.clusters.services import token_digest


def token_authenticate(*, secret: str) -> AgentToken | None:
    """The live (not revoked) token with this secret, with its cluster, or None."""
    if not secret:
        return None
    # on every ingest request: one indexed lookup, without the cluster row
    return (
        AgentToken.objects.only("id", "cluster_id", "name")
        .filter(digest=token_digest(secret), revoked_at__isnull=True)
        .first()
    )


def cluster_list() -> list[Cluster]:
    return list(Cluster.objects.order_by("name"))
