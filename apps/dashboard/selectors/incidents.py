"""Reads of the incident page: its symptoms, its timeline (alerts opened, escalated,
acknowledged and resolved, the incident acknowledged, commands issued on its nodes and runs
and how they ended), and what its actions act on."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from apps.alerts.choices import INCIDENT_ACKNOWLEDGE
from apps.alerts.models import Incident
from apps.audit.models import AuditEntry
from apps.commands.models import Command
from apps.commands.rows import command_row

TIMELINE_COMMANDS_MAX = 50
# A command issued a little before the incident opened (the detectors' next pass) acted on it.
COMMANDS_BEFORE = timedelta(minutes=5)
ENDED = {"succeeded", "failed", "expired"}


def incident_places(*, incident: Incident, members: list[dict[str, Any]]) -> dict[str, list]:
    """The nodes and runs the incident touches: its root's node first, then its alerts'."""
    nodes = [incident.root_node] if incident.root_node else []
    runs: list[str] = []
    for row in members:
        if row["node__name"] and row["node__name"] not in nodes:
            nodes.append(row["node__name"])
        if row["run__name"] and row["run__name"] not in runs:
            runs.append(row["run__name"])
    return {"nodes": nodes, "runs": runs}


def incident_commands(*, incident: Incident, nodes: list[str], runs: list[str]) -> list[Command]:
    """Commands on the incident's nodes and runs issued since just before it opened (until
    it resolved), oldest first. One query."""
    if not nodes and not runs:
        return []
    found = Command.objects.filter(
        Q(node__name__in=nodes) | Q(run__name__in=runs),
        cluster_id=incident.cluster_id,
        issued_at__gte=incident.opened_at - COMMANDS_BEFORE,
    )
    if incident.resolved_at is not None:
        found = found.filter(issued_at__lte=incident.resolved_at)
    found = found.select_related("cluster", "run", "node", "issued_by").order_by("issued_at")
    return list(found[:TIMELINE_COMMANDS_MAX])


def incident_timeline(
    *, incident: Incident, members: list[dict[str, Any]], commands: list[Command]
) -> list[dict[str, Any]]:
    """{"at", "event", "what", "actor", "note"} oldest first: each alert opened, acknowledged
    and resolved; every acknowledgement attempt of the incident (the audit log, refused ones
    too); each command issued and, once it ended, its outcome. One query (the audit log)."""
    events: list[dict[str, Any]] = []
    for row in members:
        what = f"{row['kind']} #{row['id']}"
        events.append(_event(row["opened_at"], "alert opened", what, note=row["summary"]))
        if row["acknowledged_at"]:
            by = row["acknowledged_by__username"] or ""
            events.append(
                _event(row["acknowledged_at"], "alert acknowledged", what, by, row["ack_note"])
            )
        if row["resolved_at"]:
            events.append(_event(row["resolved_at"], "alert resolved", what))
    entries = AuditEntry.objects.filter(
        cluster_id=incident.cluster_id,
        action=INCIDENT_ACKNOWLEDGE,
        target=f"incident:{incident.pk}",
    ).order_by("at", "id")[:TIMELINE_COMMANDS_MAX]
    for entry in entries:
        event = "incident acknowledged" if entry.outcome == "succeeded" else "acknowledgement"
        events.append(_event(entry.at, event, f"({entry.outcome})", entry.actor_name, entry.reason))
    for command in commands:
        row = command_row(command)
        target = row["node"] or row["run"] or ""
        events.append(
            _event(command.issued_at, f"{command.kind} issued", target, row["issued_by"],
                   row["reason"])
        )  # fmt: skip
        if command.state in ENDED and command.finished_at:
            events.append(
                _event(command.finished_at, f"{command.kind} {command.state}", target,
                       note=row["detail"])
            )  # fmt: skip
    if incident.resolved_at:
        events.append(_event(incident.resolved_at, "incident resolved", ""))
    return sorted(events, key=lambda e: e["at"])


def _event(at: datetime, event: str, what: str, actor: str = "", note: str = "") -> dict[str, Any]:
    return {"at": at, "event": event, "what": what, "actor": actor, "note": note or ""}
