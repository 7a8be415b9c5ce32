"""The incidents page (filtered like `GET /api/v1/incidents`, with the same objects), one
incident's page (its root cause or the candidates, the symptoms it folded, its
timeline, the GPU-hours it lost, and the actions that fit: cordon or drain its node,
checkpoint its run now), and acknowledging it with its symptoms."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from apps.access.choices import Action
from apps.access.selectors import clusters_visible, user_may
from apps.alerts.choices import IncidentState
from apps.alerts.selectors.incidents import (
    incident_get,
    incident_gpu_hours_lost,
    incident_list,
    incident_members,
    incidents_json,
    root_cause_json,
)
from apps.alerts.services.incidents import (
    IncidentAlreadyAcknowledged,
    IncidentResolved,
    incident_acknowledge,
    incident_acknowledge_authorize,
    incident_acknowledge_hidden,
)
from apps.clusters.choices import NodeState
from apps.clusters.models import Node
from apps.commands.choices import CommandKind
from apps.commands.forms import CommandForm
from apps.core.db_router import replica_reads
from apps.dashboard.selectors.incidents import (
    incident_commands,
    incident_places,
    incident_timeline,
)
from apps.dashboard.views.common import live_config

INCIDENT_FILTERS = ("cluster", "state", "run", "node")


@login_required
@require_GET
@replica_reads
def incidents_page(request: HttpRequest) -> HttpResponse:
    """Newest first, of the clusters the user holds a role in: each row the API's incident
    object (so its GPU-hours are the API's), with its cluster."""
    filters = {name: request.GET.get(name, "").strip()[:255] for name in INCIDENT_FILTERS}
    clusters = list(clusters_visible(user=request.user).order_by("name"))
    cluster = next((c for c in clusters if c.name == filters["cluster"]), None)
    if filters["cluster"] and cluster is None:
        raise Http404("no such cluster")
    if filters["state"] not in ("", *IncidentState.values):
        filters["state"] = ""
    incidents = incident_list(
        cluster=cluster,
        visible=clusters,
        state=filters["state"] or None,
        run=filters["run"] or None,
        node=filters["node"] or None,
    )
    rows = [
        {
            **body,
            "cluster": incident.cluster.name,
            # the page's <time> elements want datetimes; the API's epoch seconds are these
            "opened_time": incident.opened_at,
            "resolved_time": incident.resolved_at,
        }
        for incident, body in zip(incidents, incidents_json(incidents), strict=True)
    ]
    watched = [cluster.name] if cluster else [c.name for c in clusters]
    context = {
        "incidents": rows,
        "filters": filters,
        "clusters": clusters,
        "states": IncidentState.values,
        "live": live_config(watched) if watched else None,
    }
    return render(request, "dashboard/incidents.html", context)


@login_required
@require_GET
@replica_reads
def incident_detail(request: HttpRequest, incident_id: int) -> HttpResponse:
    """404 unless the incident is of a cluster the user holds a role in (or a superuser)."""
    incident = incident_get(incident_id=incident_id, visible=clusters_visible(user=request.user))
    if incident is None:
        raise Http404("no such incident")
    members = incident_members(incident_ids=[incident.pk]).get(incident.pk, [])
    places = incident_places(incident=incident, members=members)
    commands = incident_commands(incident=incident, **places)
    may_operate = user_may(user=request.user, cluster=incident.cluster, action=Action.OPERATE)
    context = {
        "cluster": incident.cluster,
        "incident": incident,
        "root_cause": root_cause_json(incident),
        "candidates": incident.candidates or [],
        "symptoms": members,
        "timeline": incident_timeline(incident=incident, members=members, commands=commands),
        "gpu_hours_lost": incident_gpu_hours_lost(members),
        "may_acknowledge": may_operate
        and incident.state == IncidentState.OPEN
        and incident.acknowledged_at is None,
        "actions": _actions(incident, places) if may_operate else [],
        "live": live_config([incident.cluster.name]),
    }
    return render(request, "dashboard/incident.html", context)


def _actions(incident: Any, places: dict[str, list]) -> list[dict[str, Any]]:
    """The command forms that fit: cordon and drain the root's node (or the one node its
    alerts name), checkpoint its run now. Each posts to the commands app's own form view
    (permission, CSRF and audit there), which returns to the node's or run's page."""
    cluster = incident.cluster.name
    actions = []
    node_name = incident.root_node or (places["nodes"][0] if len(places["nodes"]) == 1 else "")
    node = Node.objects.filter(cluster_id=incident.cluster_id, name=node_name).first()
    if node is not None and incident.state == IncidentState.OPEN:
        kinds = [] if node.state == NodeState.DRAINING else [CommandKind.DRAIN]
        if node.state == NodeState.ACTIVE:
            kinds.insert(0, CommandKind.CORDON)
        for kind in kinds:
            actions.append(
                _action(kind, node.name, reverse("node-command", args=[cluster, node.name, kind]))
            )
    if len(places["runs"]) == 1 and incident.state == IncidentState.OPEN:
        run = places["runs"][0]
        url = reverse("run-command", args=[cluster, run, CommandKind.CHECKPOINT])
        actions.append(_action(CommandKind.CHECKPOINT, run, url))
    return actions


LABELS = {"cordon": "Cordon", "drain": "Drain node", "checkpoint": "Checkpoint now"}


def _action(kind: str, target: str, url: str) -> dict[str, Any]:
    form = CommandForm(kind=kind, target_name=target)
    return {"kind": kind, "target": target, "url": url, "form": form, "label": LABELS[kind]}


@login_required
@require_POST
def incident_ack(request: HttpRequest, incident_id: int) -> HttpResponse:
    """Acknowledge the incident and its firing symptoms (CSRF-protected form; operate on
    the incident's cluster)."""
    incident = incident_get(incident_id=incident_id, visible=clusters_visible(user=request.user))
    if incident is None:
        incident_acknowledge_hidden(user=request.user, incident_id=incident_id, request=request)
        raise Http404("no such incident")
    note = request.POST.get("note", "")[:2000]
    allowed = incident_acknowledge_authorize(
        user=request.user, incident=incident, note=note, request=request
    )
    if not allowed:
        return HttpResponseForbidden("you may not acknowledge this cluster's incidents")
    try:
        incident_acknowledge(incident=incident, user=request.user, note=note, request=request)
        messages.success(request, f"Incident {incident_id} acknowledged with its alerts.")
    except (IncidentResolved, IncidentAlreadyAcknowledged) as error:
        messages.warning(request, f"Incident {incident_id} not acknowledged: {error}")
    return redirect(reverse("incident-detail", args=[incident_id]))
