"""Incident writes: fold a cluster's open alerts into incidents after each sync, and
acknowledge an incident with its symptoms.

Folding follows detectors.incidents (the causal graph, and how an incident keeps its id
across passes). It runs inside the sync's transaction, under the cluster's sync lock, so
that the notifications written there know which alerts opened an incident and which joined
one (services/announce.py: one notification per incident)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.access.choices import Action
from apps.access.selectors import user_may
from apps.access.services import attempt_hidden_record
from apps.alerts.choices import (
    INCIDENT_ACKNOWLEDGE,
    OPEN_STATES,
    AlertEvent,
    AlertState,
    IncidentState,
)
from apps.alerts.models import Alert, Incident
from apps.alerts.selectors.incidents import ALERT_FIELDS, incident_alert
from apps.alerts.services.announce import IncidentChanges, alerts_announce
from apps.audit.choices import Outcome
from apps.audit.services import audit_record
from apps.clusters.models import Cluster
from detectors.incidents import Cause, Group, fold, place


def incidents_fold(*, cluster: Cluster, at: datetime) -> IncidentChanges:
    """Inside a sync's transaction (holding the cluster's sync lock): place every open alert
    in no incident yet by the causal graph, into the open incident of its cause or a new
    one, and resolve the open incidents left with no open alert. A constant number of
    statements, however many alerts."""
    rows = list(Alert.objects.filter(cluster=cluster, state__in=OPEN_STATES).values(*ALERT_FIELDS))
    opened_at = {row["id"]: row["opened_at"] for row in rows}
    incident_of = {row["id"]: row["incident_id"] for row in rows if row["incident_id"]}
    placements = place(fold(incident_alert(row) for row in rows), incident_of)
    changes = IncidentChanges()
    new = [p for p in placements if p.incident is None]
    created = Incident.objects.bulk_create(
        Incident(
            cluster=cluster,
            opened_at=min(opened_at[pk] for pk in p.joining),
            **_root_fields(p.group),
        )
        for p in new
    )
    assign: dict[int, int] = {}
    for placement, incident in zip(new, created, strict=True):
        changes.opened[incident.pk] = min(placement.joining)
        for pk in placement.joining:
            assign[pk] = changes.members[pk] = incident.pk
    grown = [p for p in placements if p.incident is not None]
    for placement in grown:
        assert placement.incident is not None
        for pk in placement.joining:
            assign[pk] = placement.incident
            changes.joined.add(pk)
    if grown:  # the cause may be clearer now: the root follows the grown group
        Incident.objects.bulk_update(
            [Incident(pk=p.incident, **_root_fields(p.group)) for p in grown],
            ["root_kind", "root_node", "root_gpu", "root_rank", "root_alert", "candidates"],
        )
    _alerts_assign(assign)
    changes.resolved = _incidents_resolve(cluster=cluster, at=at)
    return changes


def _root_fields(group: Group) -> dict[str, Any]:
    root = group.root
    return {
        "root_kind": root.kind if root else "",
        "root_node": (root.node or "") if root else "",
        "root_gpu": root.gpu if root else None,
        "root_rank": root.rank if root else None,
        "root_alert": root.alert if root else None,
        "candidates": [_cause_json(c) for c in group.candidates],
    }


def _cause_json(cause: Cause) -> dict[str, Any]:
    return asdict(cause)


def _alerts_assign(assign: dict[int, int]) -> None:
    if not assign:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE alerts_alert a SET incident_id = v.incident FROM (SELECT"
            " unnest(%s::bigint[]) id, unnest(%s::bigint[]) incident) v WHERE a.id = v.id",
            [list(assign), list(assign.values())],
        )


# An open incident none of whose alerts is open resolves; its lead is its first alert.
_RESOLVE_SQL = """
UPDATE alerts_incident i SET state = %(resolved)s, resolved_at = %(at)s
WHERE i.cluster_id = %(cluster)s AND i.state = %(open)s
  AND NOT EXISTS (SELECT 1 FROM alerts_alert a
                  WHERE a.incident_id = i.id AND a.state = ANY(%(open_states)s))
RETURNING i.id, (SELECT min(a.id) FROM alerts_alert a WHERE a.incident_id = i.id)
"""


def _incidents_resolve(*, cluster: Cluster, at: datetime) -> dict[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(_RESOLVE_SQL, {
            "resolved": IncidentState.RESOLVED, "at": at, "cluster": cluster.pk,
            "open": IncidentState.OPEN, "open_states": list(OPEN_STATES),
        })  # fmt: skip
        return {incident: lead for incident, lead in cursor.fetchall() if lead is not None}


class IncidentResolved(Exception):
    """The incident resolved before the operator acknowledged it."""


class IncidentAlreadyAcknowledged(Exception):
    """Someone else acknowledged the incident first."""

    def __init__(self, incident: Incident) -> None:
        by = incident.acknowledged_by.get_username() if incident.acknowledged_by else "someone"
        at = incident.acknowledged_at.isoformat() if incident.acknowledged_at else "?"
        super().__init__(f"already acknowledged by {by} at {at}")
        self.incident = incident


def incident_audit_target(incident_id: int) -> str:
    """The audit log's `target` of an incident's entries."""
    return f"incident:{incident_id}"


def incident_acknowledge_authorize(
    *, user: Any, incident: Incident, note: str = "", request: Any = None
) -> bool:
    """Whether the user may acknowledge the incident (operate on its cluster); a refusal is
    recorded in the audit log (an allowed attempt is recorded by incident_acknowledge)."""
    if user_may(user=user, cluster=incident.cluster, action=Action.OPERATE):
        return True
    audit_record(
        action=INCIDENT_ACKNOWLEDGE, outcome=Outcome.DENIED, actor_user=user,
        cluster=incident.cluster, target=incident_audit_target(incident.pk), reason=note,
        request=request,
    )  # fmt: skip
    return False


def incident_acknowledge_hidden(*, user: Any, incident_id: int, request: Any = None) -> None:
    """An acknowledgement answered 404 (the incident is in a cluster the user holds no role
    in, or does not exist): recorded as denied in its cluster's audit log."""
    attempt_hidden_record(
        user=user,
        action=INCIDENT_ACKNOWLEDGE,
        target=incident_audit_target(incident_id),
        clusters=Cluster.objects.filter(incidents__pk=incident_id),
        request=request,
    )


def incident_acknowledge(
    *, incident: Incident, user: Any, note: str = "", request: Any = None
) -> Incident:
    """Acknowledge an open incident and, with it, its firing symptoms (one conditional
    UPDATE each), recorded in the audit log. Of concurrent acknowledgements exactly one wins;
    the others raise IncidentAlreadyAcknowledged, a resolved incident IncidentResolved. The
    caller checks the permission (operate on the incident's cluster)."""
    at = timezone.now()
    with transaction.atomic():
        won = Incident.objects.filter(
            pk=incident.pk, state=IncidentState.OPEN, acknowledged_at__isnull=True
        ).update(acknowledged_at=at, acknowledged_by=user, ack_note=note)
        current = Incident.objects.select_related("cluster", "acknowledged_by").get(pk=incident.pk)
        if not won:
            if current.state == IncidentState.RESOLVED:
                raise IncidentResolved("the incident is already resolved")
            raise IncidentAlreadyAcknowledged(current)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE alerts_alert SET state = %s, acknowledged_at = %s,"
                " acknowledged_by_id = %s, ack_note = %s"
                " WHERE incident_id = %s AND state = %s RETURNING id",
                [AlertState.ACKNOWLEDGED, at, user.pk, note, incident.pk, AlertState.FIRING],
            )
            symptoms = sorted(row[0] for row in cursor.fetchall())
        audit_record(
            action=INCIDENT_ACKNOWLEDGE, outcome=Outcome.SUCCEEDED, actor_user=user,
            cluster=current.cluster, target=incident_audit_target(current.pk), reason=note,
            request=request,
        )  # fmt: skip
        alerts_announce(
            cluster=current.cluster, changes=[(pk, AlertEvent.ACKNOWLEDGED) for pk in symptoms]
        )
    return current
