"""Writing the audit log (apps.audit.models.AuditEntry): one row per attempted action, and
pruning it past its retention (as the table's owner only: `manage.py audit_prune`)."""

import uuid
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pgtrigger
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.http import HttpRequest
from django.utils import timezone

from apps.audit.choices import ActorKind, AuditAction, Outcome
from apps.audit.models import AuditEntry
from apps.core.client_ip import client_ip

REQUEST_ID_HEADER = "HTTP_X_REQUEST_ID"
REQUEST_ID_MAX = 64
AGENT_TOKEN_ACTIONS = {
    "issue": AuditAction.AGENT_TOKEN_ISSUE,
    "revoke": AuditAction.AGENT_TOKEN_REVOKE,
}


def audit_record(
    *,
    action: str,
    outcome: str,
    actor_user: Any = None,
    actor_kind: str = ActorKind.USER,
    actor_name: str = "",
    cluster: Any = None,
    target: str = "",
    reason: str = "",
    detail: dict | None = None,
    request: HttpRequest | None = None,
) -> AuditEntry:
    """Append one entry. Call it for denied attempts too. With `request`: the client IP
    (apps.core.client_ip: X-Forwarded-For only through TRUSTED_PROXIES) and the request id
    (X-Request-ID, else a fresh uuid, kept on the request so every entry of one request
    shares it); a request authenticated by a personal token is recorded as actor_kind
    "token". Runs in the caller's transaction, if any: an action rolled back leaves no entry
    claiming it succeeded. A request authenticated by an agent token is recorded as
    actor_kind "agent" named by its token (agent_actor_name), never empty."""
    if actor_kind == ActorKind.USER and getattr(request, "user_token", None) is not None:
        actor_kind = ActorKind.TOKEN
        detail = {**(detail or {}), "token": request.user_token.prefix}
    agent_token = getattr(request, "agent_token", None)
    if agent_token is not None:
        actor_kind, actor_name = ActorKind.AGENT, agent_actor_name(agent_token)
        detail = {**(detail or {}), "agent_token": agent_token_detail(agent_token)}
    return AuditEntry.objects.create(
        at=timezone.now(),
        actor_kind=actor_kind,
        actor_user_id=getattr(actor_user, "pk", None),
        actor_name=actor_name or getattr(actor_user, "username", "") or "",
        action=action,
        cluster_id=getattr(cluster, "pk", None),
        cluster_name=getattr(cluster, "name", "") or "",
        target=target[:255],
        reason=reason,
        outcome=outcome,
        detail=detail or {},
        client_ip=client_ip(request) if request is not None else None,
        request_id=_request_id(request),
    )


def agent_actor_name(token: Any) -> str:
    """An agent token as an actor: its name and id ("node-agent (token 7)"), or its id."""
    return f"{token.name} (token {token.pk})" if token.name else f"token {token.pk}"


def agent_token_detail(token: Any) -> dict[str, Any]:
    # what the ingest path's token lookup loads (apps.clusters.selectors): id, name and the
    # nodes it is bound to (none: cluster-wide, trusted with every node of the cluster)
    return {"id": token.pk, "name": token.name, "nodes": list(token.nodes or [])}


def agent_token_audit(
    sender: Any, *, action: str, token: dict, actor: Any, request: Any, **kwargs: Any
) -> None:
    """apps.clusters.signals.agent_token_changed receiver (AuditConfig.ready): an agent
    token issued or revoked, by `actor` (None: the command line)."""
    audit_record(
        action=AGENT_TOKEN_ACTIONS[action],
        outcome=Outcome.SUCCEEDED,
        actor_user=actor,
        actor_name="" if actor is not None else "manage.py",
        cluster=SimpleNamespace(pk=token["cluster_id"], name=token["cluster_name"]),
        target=f"agent_token:{token['id']}",
        detail={"agent_token": {key: token[key] for key in ("id", "name", "prefix", "nodes")}},
        request=request,
    )


def _request_id(request: HttpRequest | None) -> str:
    if request is None:
        return ""
    if not hasattr(request, "audit_request_id"):
        given = request.META.get(REQUEST_ID_HEADER, "")[:REQUEST_ID_MAX]
        request.audit_request_id = given if given.isprintable() and given else uuid.uuid4().hex
    return request.audit_request_id


# The append-only trigger's URI for pgtrigger.ignore (the TRUNCATE trigger stays on).
APPEND_ONLY_TRIGGER = "audit.AuditEntry:audit_append_only"
PRUNE_SQL = (
    "DELETE FROM audit_auditentry WHERE id = ANY(ARRAY("
    "SELECT id FROM audit_auditentry WHERE at < %s ORDER BY at, id LIMIT %s))"
)  # positional: pgtrigger.ignore prefixes a statement of its own with one


def audit_prune(
    *, cutoff: datetime, batch: int, max_batches: int, using: str = DEFAULT_DB_ALIAS
) -> AuditEntry:
    """Delete the entries older than `cutoff`, then append one entry recording it (action
    "audit.prune", actor kind "system": cutoff, entries deleted, whether older ones remain),
    all in one transaction: the log never loses entries without saying so. At most
    `max_batches` statements of `batch` entries; what remains goes at the next run.

    Only the table's owner can: it skips the append-only trigger (pgtrigger.ignore), and the
    runtime role holds no DELETE on the table (docs/security.md): as that role the first
    DELETE fails with a permission error and the transaction deletes nothing. Returns the
    recording entry."""
    deleted, more = 0, False
    # the ignore outside the transaction: its clean-up would fail in a transaction aborted
    # by a refused DELETE (and hide the refusal); its setting is local to the transaction
    with (
        pgtrigger.ignore(APPEND_ONLY_TRIGGER, databases=[using]),
        transaction.atomic(using=using),
    ):
        with connections[using].cursor() as cursor:
            for _ in range(max_batches):
                cursor.execute(PRUNE_SQL, [cutoff, batch])
                deleted += cursor.rowcount
                more = cursor.rowcount == batch
                if not more:
                    break
        return AuditEntry.objects.using(using).create(
            at=timezone.now(),
            actor_kind=ActorKind.SYSTEM,
            actor_name="audit_prune",
            action=AuditAction.AUDIT_PRUNE,
            target="audit_auditentry",
            outcome=Outcome.SUCCEEDED,
            detail={"cutoff": cutoff.isoformat(), "deleted": deleted, "more": more},
        )
