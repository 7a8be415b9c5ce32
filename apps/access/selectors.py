"""Who may see and do what: cluster roles, and personal API tokens."""

from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.access.choices import ROLES_FOR_ACTION, USER_TOKEN_PREFIX
from apps.access.models import ClusterRole, UserToken
from apps.clusters.models import Cluster, Node
from apps.clusters.services import token_digest
from apps.core.db_router import replica_reads_active
from apps.core.errors import FieldError


def clusters_visible(*, user: Any) -> QuerySet[Cluster]:
    """The clusters `user` holds any role in; every cluster for a superuser, none for an
    anonymous or inactive user."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Cluster.objects.none()
    if user.is_superuser:
        return Cluster.objects.all()
    return _roles_read_on_primary(Cluster.objects.filter(roles__user=user))


def role_of(*, user: Any, cluster: Cluster) -> str | None:
    """The user's role on the cluster, or None (a superuser's stored role, if any)."""
    if user is None or not user.is_authenticated:
        return None
    return (
        ClusterRole.objects.filter(user=user, cluster=cluster)
        .values_list("role", flat=True)
        .first()
    )


def user_may(*, user: Any, cluster: Cluster, action: str) -> bool:
    """Whether the user may `action` ("view", "operate", "administer") on the cluster."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    return role_of(user=user, cluster=cluster) in ROLES_FOR_ACTION[action]


def clusters_administered(*, user: Any) -> QuerySet[Cluster]:
    """The clusters whose audit log and roles the user may manage (superuser: all)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Cluster.objects.none()
    if user.is_superuser:
        return Cluster.objects.all()
    return _roles_read_on_primary(
        Cluster.objects.filter(roles__user=user, roles__role__in=ROLES_FOR_ACTION["administer"])
    )


def clusters_allowing(*, user: Any, action: str) -> QuerySet[Cluster]:
    """The clusters where `user` may `action` ("view", "operate", "administer"): every
    cluster for an active superuser, none for an anonymous or inactive user."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Cluster.objects.none()
    if user.is_superuser:
        return Cluster.objects.all()
    return _roles_read_on_primary(
        Cluster.objects.filter(roles__user=user, roles__role__in=ROLES_FOR_ACTION[action])
    )


def _roles_read_on_primary(clusters: QuerySet[Cluster]) -> QuerySet[Cluster]:
    """The same clusters; inside replica reads (apps.core.db_router) their role join is read
    on the primary now and the ids handed on, so that a role granted or revoked there takes
    effect at once, however far the replica lags."""
    if not replica_reads_active():
        return clusters
    ids = list(clusters.using(DEFAULT_DB_ALIAS).values_list("pk", flat=True))
    return Cluster.objects.filter(pk__in=ids)


def user_token_authenticate(*, secret: str) -> UserToken | None:
    """The live (not revoked) personal token with this secret, with its active user."""
    if not secret.startswith(USER_TOKEN_PREFIX):
        return None
    return (
        UserToken.objects.select_related("user")
        .filter(digest=token_digest(secret), revoked_at__isnull=True, user__is_active=True)
        .first()
    )


def request_cluster_filter(request: HttpRequest, cluster: str | None) -> dict:
    """The clusters a reader may see: its token's, or (for a user) those it holds a role in,
    narrowed to the named one, if any; another cluster's objects are not found (404)."""
    token = getattr(request, "agent_token", None)
    if token is not None:
        return {"cluster_id": token.cluster_id}
    visible = {"cluster__in": clusters_visible(user=request.user)}
    return {**visible, "cluster__name": cluster} if cluster else visible


def clusters_readable(request: HttpRequest, cluster: str | None) -> QuerySet[Cluster]:
    """The clusters request_cluster_filter lets the reader see, as clusters."""
    token = getattr(request, "agent_token", None)
    if token is not None:
        return Cluster.objects.filter(pk=token.cluster_id)
    visible = clusters_visible(user=request.user)
    return visible.filter(name=cluster) if cluster else visible


def nodes_visible_named(request: HttpRequest, name: str, cluster: str | None) -> QuerySet[Node]:
    """The nodes called `name` that the reader may see (request_cluster_filter)."""
    return Node.objects.filter(name=name, **request_cluster_filter(request, cluster))


def node_only(rows: list) -> Any:
    """The one row of a node lookup; 404/400 naming `node` when there is none or several."""
    if len(rows) != 1:
        raise FieldError(
            404 if not rows else 400,
            "node",
            "no such node" if not rows else "in several clusters: name the cluster",
        )
    return rows[0]


def audit_may_read(*, user: Any) -> bool:
    """Whether the user may read an audit log: a superuser, or an admin of some cluster."""
    return user.is_superuser or clusters_administered(user=user).exists()


def audit_cluster_ids(*, user: Any) -> list[int] | None:
    """The clusters whose audit entries `user` reads; None for a superuser (every entry)."""
    if user.is_superuser:
        return None
    return list(clusters_administered(user=user).values_list("pk", flat=True))
