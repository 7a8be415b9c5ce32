from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from apps.access.auth import session_auth, user_token_auth
from apps.access.selectors import audit_cluster_ids, audit_may_read
from apps.audit.selectors import audit_json, audit_list
from apps.core.errors import Errors, FieldError
from apps.core.params import CLUSTER_MAX_LENGTH, timestamp_field

router = Router(tags=["audit"])


class AuditEntryOut(Schema):
    id: int
    at: float
    actor_kind: Literal["user", "token", "policy", "agent", "system"]
    actor: str
    action: str
    cluster: str | None
    target: str
    reason: str
    outcome: Literal["allowed", "denied", "succeeded", "failed", "invalid"]
    detail: dict[str, Any]
    client_ip: str | None
    request_id: str


class AuditOut(Schema):
    entries: list[AuditEntryOut]


class AuditQuery(Schema):
    since: float | None = timestamp_field("entries at or after (Unix seconds)")
    actor: str | None = Field(default=None, max_length=150)
    action: str | None = Field(default=None, max_length=64)
    outcome: Literal["allowed", "denied", "succeeded", "failed", "invalid"] | None = None
    cluster: str | None = Field(default=None, max_length=CLUSTER_MAX_LENGTH)


@router.get(
    "/audit",
    auth=[user_token_auth, session_auth],
    response={200: AuditOut, 400: Errors, 401: Errors, 403: Errors},
    summary="The audit log of the clusters you administer, newest first",
)
def audit(request: HttpRequest, query: Query[AuditQuery]):
    if not audit_may_read(user=request.user):
        raise FieldError(403, "", "only a cluster's admins read its audit log")
    entries = audit_list(
        cluster_ids=audit_cluster_ids(user=request.user),
        cluster=query.cluster or "",
        actor=query.actor or "",
        action=query.action or "",
        outcome=query.outcome or "",
        since=query.since,
    )
    return {"entries": [audit_json(entry) for entry in entries]}
