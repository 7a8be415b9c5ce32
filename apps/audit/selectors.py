"""Reading the audit log: filtered, newest first, limited to the clusters one may audit."""

from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet

from apps.audit.models import AuditEntry

AUDIT_LIST_LIMIT = 1000
CSV_COLUMNS = (
    "at", "actor_kind", "actor_name", "action", "cluster_name", "target", "reason", "outcome",
    "client_ip", "request_id", "detail",
)  # fmt: skip


def audit_list(
    *,
    cluster_ids: list[int] | None,
    cluster: str = "",
    actor: str = "",
    action: str = "",
    outcome: str = "",
    since: float | None = None,
    limit: int = AUDIT_LIST_LIMIT,
) -> list[AuditEntry]:
    """The entries of the clusters `cluster_ids`, newest first; None: every entry (those of
    no cluster too, such as token issues). Who may read which is apps.access's
    (`audit_cluster_ids`). Empty filters do not narrow."""
    entries: QuerySet[AuditEntry] = AuditEntry.objects.all()
    if cluster_ids is not None:
        entries = entries.filter(cluster_id__in=cluster_ids)
    for field, value in (
        ("cluster_name", cluster), ("actor_name", actor), ("action", action),
        ("outcome", outcome),
    ):  # fmt: skip
        if value:
            entries = entries.filter(**{field: value})
    if since is not None:
        entries = entries.filter(at__gte=datetime.fromtimestamp(since, UTC))
    return list(entries.order_by("-at", "-id")[:limit])


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.pk,
        "at": entry.at.timestamp(),
        "actor_kind": entry.actor_kind,
        "actor": entry.actor_name,
        "action": entry.action,
        "cluster": entry.cluster_name or None,
        "target": entry.target,
        "reason": entry.reason,
        "outcome": entry.outcome,
        "detail": entry.detail,
        "client_ip": entry.client_ip,
        "request_id": entry.request_id,
    }
