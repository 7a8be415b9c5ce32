"""Granting roles and issuing personal tokens; every change is audited."""

import logging
import secrets
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.access.choices import USER_TOKEN_PREFIX, Role
from apps.access.models import ClusterRole, UserToken
from apps.audit.choices import ActorKind, AuditAction, Outcome
from apps.audit.services import audit_record
from apps.clusters.models import Cluster
from apps.clusters.services import token_digest
from apps.core.signals import role_revoked

logger = logging.getLogger(__name__)

TOKEN_PREFIX_SHOWN = 12  # "obu_" and 8 characters of the secret


def role_grant(
    *, user: Any, cluster: Cluster, role: str, actor: Any = None, request: Any = None
) -> ClusterRole:
    """Give `user` exactly `role` on `cluster` (replacing any other role there), audited as
    done by `actor` (None: the command line)."""
    role = Role(role)
    with transaction.atomic():
        grant, _ = ClusterRole.objects.update_or_create(
            user=user, cluster=cluster, defaults={"role": role}
        )
        _audit(AuditAction.ROLE_GRANT, actor, cluster, f"user:{user.username}", request,
               detail={"role": role.value})  # fmt: skip
    return grant


def role_revoke(*, user: Any, cluster: Cluster, actor: Any = None, request: Any = None) -> bool:
    """Remove the user's role on the cluster; False when there was none. On commit,
    apps.core.signals.role_revoked is sent (the user's live sockets on the cluster close)."""
    with transaction.atomic():
        deleted, _ = ClusterRole.objects.filter(user=user, cluster=cluster).delete()
        if deleted:
            _audit(AuditAction.ROLE_REVOKE, actor, cluster, f"user:{user.username}", request)
            user_id, cluster_id = user.pk, cluster.pk
            transaction.on_commit(lambda: _send_revoked(user_id, cluster_id))
    return bool(deleted)


def _send_revoked(user_id: int, cluster_id: int) -> None:
    """After commit: tell the receivers (apps.live); a failing one is logged."""
    outcomes = role_revoked.send_robust(sender=ClusterRole, user_id=user_id, cluster_id=cluster_id)
    for receiver, outcome in outcomes:
        if isinstance(outcome, Exception):
            logger.error("%s failed on the revoked role of user %s on cluster %s",
                         getattr(receiver, "__qualname__", receiver), user_id, cluster_id,
                         exc_info=outcome)  # fmt: skip


def role_move(
    *, grant: ClusterRole, user: Any, role: str, actor: Any = None, request: Any = None
) -> ClusterRole:
    """Give the grant's role on its cluster to `user` instead (as `role`): the old holder's
    access ends (a revoke, audited) and the new holder's begins (a grant, audited), in one
    transaction. The same user: a plain grant of `role`."""
    with transaction.atomic():
        rows = ClusterRole.objects.select_for_update(of=("self",))
        held = rows.select_related("user", "cluster").get(pk=grant.pk)
        if held.user_id != user.pk:
            role_revoke(user=held.user, cluster=held.cluster, actor=actor, request=request)
        return role_grant(user=user, cluster=held.cluster, role=role, actor=actor,
                          request=request)  # fmt: skip


def user_token_issue(
    *, user: Any, name: str = "", actor: Any = None, request: Any = None
) -> tuple[UserToken, str]:
    """A new personal token for `user` and its secret (returned only here, stored hashed)."""
    secret = USER_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = UserToken.objects.create(
            user=user, name=name, prefix=secret[:TOKEN_PREFIX_SHOWN], digest=token_digest(secret)
        )
        _audit(AuditAction.TOKEN_ISSUE, actor, None, f"user:{user.username}", request,
               detail={"token": token.prefix})  # fmt: skip
    return token, secret


def user_token_revoke(*, token: UserToken, actor: Any = None, request: Any = None) -> bool:
    """Revoke the token (at once: the next request with it is refused); False if it already
    was."""
    with transaction.atomic():
        revoked = UserToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if revoked:
            _audit(AuditAction.TOKEN_REVOKE, actor, None, f"user:{token.user.username}",
                   request, detail={"token": token.prefix})  # fmt: skip
    return bool(revoked)


HIDDEN_CLUSTERS_RECORDED = 10  # a name in more hidden clusters than this is noise, not news


def attempt_hidden_record(
    *, user: Any, action: str, target: str, clusters: Iterable[Cluster], request: Any = None
) -> None:
    """An attempt answered 404 because what it names is in a cluster the user holds no role
    in (to them it does not exist): one denied entry per such cluster, so that cluster's
    admins read it, or one of no cluster when nothing by that name exists anywhere."""
    hidden = list(clusters)[:HIDDEN_CLUSTERS_RECORDED] or [None]
    for cluster in hidden:
        audit_record(
            action=action,
            outcome=Outcome.DENIED,
            actor_user=user,
            cluster=cluster,
            target=target,
            detail={"answered": 404},
            request=request,
        )


def _audit(action: str, actor: Any, cluster: Any, target: str, request: Any, **extra) -> None:
    audit_record(
        action=action,
        outcome=Outcome.SUCCEEDED,
        actor_user=actor,
        actor_kind=ActorKind.USER,
        actor_name="" if actor is not None else "manage.py",
        cluster=cluster,
        target=target,
        request=request,
        **extra,
    )
