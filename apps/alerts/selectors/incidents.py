"""Reads of incidents: the contract's incident object, the list and one, their alerts, and
GPU-hours lost (one definition, detectors.incidents.gpu_hours_lost, for the API and the page).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from apps.alerts.models import Alert, Incident
from apps.alerts.selectors.window import ts
from apps.clusters.models import Cluster
from detectors.incidents import IncidentAlert, gpu_hours_lost

INCIDENT_LIST_LIMIT = 500

# What folding and the incident reads need of an alert (`.values()` keys).
ALERT_FIELDS = ("id", "kind", "subject", "opened_at", "last_seen_at", "gpu", "rank")
ALERT_FIELDS += ("evidence", "incident_id", "run__name", "node__name")
MEMBER_FIELDS = (*ALERT_FIELDS, "summary", "severity", "state", "acknowledged_at")
MEMBER_FIELDS += ("resolved_at", "acknowledged_by__username", "ack_note")


def incident_alert(row: dict[str, Any]) -> IncidentAlert:
    """What folding sees of an alert, from a `.values(*ALERT_FIELDS)` row."""
    return IncidentAlert(
        id=row["id"],
        kind=row["kind"],
        subject=row["subject"],
        opened_at=row["opened_at"].timestamp(),
        run=row["run__name"],
        node=row["node__name"],
        gpu=row["gpu"],
        rank=row["rank"],
        last_seen=row["last_seen_at"].timestamp(),
        evidence=row["evidence"] if isinstance(row["evidence"], dict) else {},
    )


def incident_members(*, incident_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """incident id → its alerts (`.values(*MEMBER_FIELDS)` rows), oldest first. One query."""
    out: dict[int, list[dict[str, Any]]] = {}
    rows = Alert.objects.filter(incident_id__in=list(incident_ids)).order_by("id")
    for row in rows.values(*MEMBER_FIELDS):
        out.setdefault(row["incident_id"], []).append(row)
    return out


def incident_gpu_hours_lost(members: list[dict[str, Any]]) -> float:
    """GPU-hours the incident's alerts cost so far (detectors.incidents.gpu_hours_lost: each
    symptom's own cost from its evidence, until the last pass that saw it)."""
    return gpu_hours_lost(incident_alert(row) for row in members)


def root_cause_json(incident: Incident) -> dict[str, Any] | None:
    """{"kind", "node", "gpu", "rank"} of the root, or None when it is unknown."""
    if not incident.root_kind:
        return None
    return {
        "kind": incident.root_kind,
        "node": incident.root_node or None,
        "gpu": incident.root_gpu,
        "rank": incident.root_rank,
    }


def incident_json(incident: Incident, members: list[dict[str, Any]]) -> dict[str, Any]:
    """The contract's incident object (GET /api/v1/incidents), exactly these keys."""
    return {
        "id": incident.pk,
        "state": incident.state,
        "root_cause": root_cause_json(incident),
        "candidates": [
            {key: c.get(key) for key in ("kind", "node", "gpu", "rank", "alert")}
            for c in incident.candidates or []
            if isinstance(c, dict)
        ],
        "alerts": [row["id"] for row in members],
        "opened_at": ts(incident.opened_at),
        "acknowledged_at": ts(incident.acknowledged_at),
        "resolved_at": ts(incident.resolved_at),
        "gpu_hours_lost": incident_gpu_hours_lost(members),
    }


def incident_get(*, incident_id: int, visible: QuerySet | None = None) -> Incident | None:
    """The incident, if it is of one of the `visible` clusters (None: of any cluster)."""
    found = Incident.objects.select_related("cluster", "acknowledged_by").filter(pk=incident_id)
    if visible is not None:
        found = found.filter(cluster__in=visible)
    return found.first()


def incident_list(
    *,
    cluster: Cluster | None,
    state: str | None = None,
    run: str | None = None,
    node: str | None = None,
    visible: QuerySet | None = None,
    limit: int | None = INCIDENT_LIST_LIMIT,
) -> list[Incident]:
    """Incidents newest first (of the `visible` clusters only, when given). `run` and `node`
    keep the incidents with an alert of that run or on that node, or rooted at that node.
    `limit` None: all of them (a report counts every one)."""
    found: QuerySet[Incident] = Incident.objects.select_related("cluster")
    if visible is not None:
        found = found.filter(cluster__in=visible)
    if cluster is not None:
        found = found.filter(cluster=cluster)
    if state is not None:
        found = found.filter(state=state)
    if run is not None:
        found = found.filter(Exists(Alert.objects.filter(incident=OuterRef("pk"), run__name=run)))
    if node is not None:
        on_node = Alert.objects.filter(incident=OuterRef("pk"), node__name=node)
        found = found.filter(Q(root_node=node) | Exists(on_node))
    found = found.order_by("-opened_at", "-id")
    return list(found if limit is None else found[:limit])


def incidents_json(incidents: list[Incident]) -> list[dict[str, Any]]:
    """The incidents as contract objects, with their alerts: one query for all of them."""
    members = incident_members(incident_ids=[i.pk for i in incidents])
    return [incident_json(i, members.get(i.pk, [])) for i in incidents]
