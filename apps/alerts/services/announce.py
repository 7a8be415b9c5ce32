"""Telling others of alert changes: the live feed, webhook deliveries, and the receivers of
apps.core.signals.alert_raised. Each change is snapshotted inside the writing transaction and
sent on commit, best effort (the alerts are stored either way)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db import transaction

from apps.alerts.choices import WEBHOOK_EVENTS, AlertEvent
from apps.alerts.models import Alert, Incident, WebhookDelivery, WebhookEndpoint
from apps.alerts.selectors import alert_json
from apps.alerts.selectors.incidents import incident_json, incident_members
from apps.alerts.services.webhooks import WEBHOOK_DELIVER_TASK, webhook_body
from apps.clusters.models import Cluster
from apps.core.signals import alert_raised
from apps.core.tasks import task_enqueue
from apps.live.groups import cluster_group
from apps.live.send import group_send

logger = logging.getLogger(__name__)


@dataclass
class IncidentChanges:
    """What a sync's fold changed (services/incidents.py): incidents opened and resolved
    (id → its lead alert, the first, which their notifications name), the alerts that joined
    an incident already open, and the incident of each alert of those opened."""

    opened: dict[int, int] = field(default_factory=dict)
    resolved: dict[int, int] = field(default_factory=dict)
    joined: set[int] = field(default_factory=set)
    members: dict[int, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.opened or self.resolved or self.joined)


Notice = tuple[int, str, int | None]  # (alert, event, its incident): one webhook delivery


def alerts_announce(
    *,
    cluster: Cluster,
    changes: list[tuple[int, str | None]],
    incidents: IncidentChanges | None = None,
) -> None:
    """Inside the writing transaction: snapshot the changed alerts, write their webhook
    deliveries, and on commit broadcast them, enqueue the deliveries and send alert_raised
    for those that opened or escalated.

    Webhooks hear of incidents, not symptoms (`_notices`): an incident's opening and its
    resolution once each, naming its lead alert and what it folded; an alert that joins an
    open incident, or resolves inside one still open, sends nothing of its own."""
    if not changes and not (incidents and incidents.resolved):
        return
    leads = set(incidents.resolved.values()) if incidents else set()
    rows = Alert.objects.select_related("run", "node").filter(
        pk__in=[pk for pk, _ in changes] + sorted(leads)
    )
    alerts = {alert.pk: alert_json(alert) for alert in rows}
    notices = _notices(changes, incidents, alerts)
    endpoints = list(WebhookEndpoint.objects.filter(cluster=cluster, active=True))
    bodies = _incident_bodies({i for _, _, i in notices if i is not None}) if endpoints else {}
    deliveries = WebhookDelivery.objects.bulk_create(
        WebhookDelivery(
            endpoint=endpoint,
            alert_id=pk,
            event=event,
            payload=webhook_body(
                fmt=endpoint.format,
                event=event,
                cluster=cluster.name,
                alert=alerts[pk],
                incident=bodies.get(incident) if incident is not None else None,
            ),  # fmt: skip
        )
        for pk, event, incident in notices
        for endpoint in endpoints
    )
    changed = {pk for pk, _ in changes}
    messages = [alert for pk, alert in alerts.items() if pk in changed]
    delivery_ids = [delivery.pk for delivery in deliveries]
    raised = _raised(changes)
    transaction.on_commit(
        lambda: _publish(
            cluster_id=cluster.pk, alerts=messages, delivery_ids=delivery_ids, raised=raised
        )
    )


def _notices(
    changes: list[tuple[int, str | None]],
    incidents: IncidentChanges | None,
    alerts: dict[int, dict[str, Any]],
) -> list[Notice]:
    """The webhook deliveries of these changes: one per incident opened (its lead alert) and
    resolved, and each escalation (a symptom turning critical is news), naming the incident.
    An alert in no incident is announced alone, as before incidents."""
    notices: list[Notice] = []
    opened = incidents.opened if incidents else {}
    members = incidents.members if incidents else {}
    joined = incidents.joined if incidents else set()
    for pk, event in changes:
        if event not in WEBHOOK_EVENTS or pk not in alerts:
            continue
        incident = members.get(pk, alerts[pk]["incident"])
        if event == AlertEvent.OPENED and (
            pk in joined or (incident in opened and opened[incident] != pk)
        ):
            continue  # folded into an incident announced by its lead
        if event == AlertEvent.RESOLVED and incident is not None:
            continue  # the incident's resolution is announced when its last alert resolves
        notices.append((pk, str(event), incident))
    for incident, lead in (incidents.resolved if incidents else {}).items():
        if lead in alerts:
            notices.append((lead, str(AlertEvent.RESOLVED), incident))
    return notices


def _incident_bodies(ids: set[int]) -> dict[int, dict[str, Any]]:
    """incident → the contract's incident object and `folded`: its alerts in words."""
    if not ids:
        return {}
    members = incident_members(incident_ids=ids)
    out = {}
    for incident in Incident.objects.filter(pk__in=ids):
        rows = members.get(incident.pk, [])
        folded = [
            {"id": r["id"], "kind": r["kind"], "severity": r["severity"], "summary": r["summary"]}
            for r in rows
        ]
        out[incident.pk] = {**incident_json(incident, rows), "folded": folded}
    return out


RAISED_EVENTS = (AlertEvent.OPENED, AlertEvent.ESCALATED)
# What a receiver gets of each alert: plain values, never the model (see apps.core.signals).
RAISED_FIELDS = ["id", "cluster_id", "node_id", "run_id", "kind", "subject", "severity"]
RAISED_FIELDS += ["summary", "evidence"]


def _raised(changes: list[tuple[int, str | None]]) -> list[dict[str, Any]]:
    """The apps.core.signals.alert_raised payloads of the alerts that opened or escalated."""
    events = {pk: event for pk, event in changes if event in RAISED_EVENTS}
    if not events:
        return []
    rows = Alert.objects.filter(pk__in=list(events)).values(*RAISED_FIELDS)
    return [{**row, "event": str(events[row["id"]])} for row in rows]


def _send_raised(raised: list[dict[str, Any]]) -> None:
    """After commit: tell the receivers (the auto-cordon policy); a failing one is logged."""
    for alert in raised:
        for receiver, outcome in alert_raised.send_robust(sender=Alert, alert=alert):
            if isinstance(outcome, Exception):
                logger.error(
                    "%s failed on alert %s", getattr(receiver, "__qualname__", receiver),
                    alert["id"], exc_info=outcome,
                )  # fmt: skip


def _publish(
    *, cluster_id: int, alerts: list[dict], delivery_ids: list[int], raised: list[dict]
) -> None:
    """After commit, best effort: the alerts are stored, and a browser that misses a message
    reads them again on reload; a delivery not enqueued stays in the table, attempts 0.
    Then alert_raised for the alerts that opened or escalated."""
    try:
        for alert in alerts:
            group_send(cluster_group(cluster_id), {"type": "alert.changed", "alert": alert})
    except (redis.RedisError, OSError):
        logger.warning("live feed unavailable; %d alert changes not broadcast", len(alerts))
    for delivery_id in delivery_ids:
        try:
            task_enqueue(WEBHOOK_DELIVER_TASK, delivery_id, retry=False)
        except Exception:  # any broker failure
            logger.warning("broker unavailable; webhook delivery %s not enqueued", delivery_id)
    _send_raised(raised)  # last: a receiver may run a scheduler hook (the auto-cordon policy)
