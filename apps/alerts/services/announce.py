"""Telling others of alert changes: the live feed, webhook deliveries, and the receivers of
apps.core.signals.alert_raised. Each change is snapshotted inside the writing transaction and
sent on commit, best effort (the alerts are stored either way)."""

from __future__ import annotations

import logging
from typing import Any

import redis
from django.db import transaction

from apps.alerts.choices import WEBHOOK_EVENTS, AlertEvent
from apps.alerts.models import Alert, WebhookDelivery, WebhookEndpoint
from apps.alerts.selectors import alert_json
from apps.alerts.services.webhooks import WEBHOOK_DELIVER_TASK, webhook_body
from apps.clusters.models import Cluster
from apps.core.signals import alert_raised
from apps.core.tasks import task_enqueue
from apps.live.groups import cluster_group
from apps.live.send import group_send

logger = logging.getLogger(__name__)


def alerts_announce(*, cluster: Cluster, changes: list[tuple[int, str | None]]) -> None:
    """Inside the writing transaction: snapshot the changed alerts, write their webhook
    deliveries, and on commit broadcast them, enqueue the deliveries and send alert_raised
    for those that opened or escalated."""
    if not changes:
        return
    alerts = {
        alert.pk: alert_json(alert)
        for alert in Alert.objects.select_related("run", "node").filter(
            pk__in=[pk for pk, _ in changes]
        )
    }
    endpoints = list(WebhookEndpoint.objects.filter(cluster=cluster, active=True))
    deliveries = WebhookDelivery.objects.bulk_create(
        WebhookDelivery(
            endpoint=endpoint,
            alert_id=pk,
            event=event,
            payload=webhook_body(
                fmt=endpoint.format, event=event, cluster=cluster.name, alert=alerts[pk]
            ),
        )
        for pk, event in changes
        if event in WEBHOOK_EVENTS
        for endpoint in endpoints
    )
    messages = list(alerts.values())
    delivery_ids = [delivery.pk for delivery in deliveries]
    raised = _raised(changes)
    transaction.on_commit(
        lambda: _publish(
            cluster_id=cluster.pk, alerts=messages, delivery_ids=delivery_ids, raised=raised
        )
    )


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
