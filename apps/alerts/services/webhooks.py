"""Outgoing webhooks of alert changes: the body per endpoint format, delivery and the sweep
of deliveries never enqueued."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from apps.alerts.choices import WebhookFormat
from apps.alerts.models import WebhookDelivery
from apps.core.tasks import task_enqueue

# A delivery not attempted this long after its alert changed was never enqueued.
WEBHOOK_SWEEP_AGE_S = 300
# The delivery task (apps/alerts/tasks.py registers it under this name)
WEBHOOK_DELIVER_TASK = "alerts.webhook_deliver"


class WebhookFailed(Exception):
    """A delivery attempt failed; the Celery task retries it with backoff."""


def webhooks_sweep(*, now: float) -> int:
    """Enqueue deliveries never attempted (the broker was down when their alert changed),
    once they are WEBHOOK_SWEEP_AGE_S old and for a day at most; returns how many."""
    oldest = datetime.fromtimestamp(now - 86_400, UTC)
    newest = datetime.fromtimestamp(now - WEBHOOK_SWEEP_AGE_S, UTC)
    ids = list(
        WebhookDelivery.objects.filter(
            attempts=0, delivered_at__isnull=True, created_at__range=(oldest, newest)
        ).values_list("pk", flat=True)[:1000]
    )
    for delivery_id in ids:
        task_enqueue(WEBHOOK_DELIVER_TASK, delivery_id)
    return len(ids)


def webhook_body(*, fmt: str, event: str, cluster: str, alert: Mapping[str, Any]) -> dict:
    """The body posted to an endpoint: the contract's alert object with the event name, or
    for Slack-compatible endpoints a {"text": ...} message."""
    if fmt == WebhookFormat.SLACK:
        where = ", ".join(
            f"{name} {alert[name]}"
            for name in ("run", "node", "rank", "gpu")
            if alert[name] is not None
        )
        text = (
            f"[{alert['severity']}] {alert['kind']} {event} on cluster {cluster}"
            f"{f' ({where})' if where else ''}: {alert['summary']}"
        )
        # Names and summaries come from agents: `<!channel>` in a node name must not ping.
        return {"text": slack_escape(text)}
    return {"event": event, "cluster": cluster, "alert": dict(alert)}


def slack_escape(text: str) -> str:
    """Text shown literally by Slack: its control characters &, <, > as entities (Slack's
    rules escape only these three). We send no links or mentions of our own, so escaping the
    whole message leaves nothing of ours to keep."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def webhook_deliver(*, delivery_id: int) -> bool:
    """Post one delivery (once it succeeded, never again); raises WebhookFailed on a
    connection error or a non-2xx answer, after recording the attempt."""
    delivery = WebhookDelivery.objects.select_related("endpoint").filter(pk=delivery_id).first()
    if delivery is None or delivery.delivered_at is not None:
        return False
    WebhookDelivery.objects.filter(pk=delivery_id).update(attempts=F("attempts") + 1)
    request = urllib.request.Request(
        delivery.endpoint.url,
        data=orjson.dumps(delivery.payload),
        headers={"Content-Type": "application/json", "User-Agent": "Opsboard-alerts/1"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.ALERT_WEBHOOK_TIMEOUT_S):
            pass  # urlopen raises HTTPError for any status >= 400
    except (urllib.error.URLError, OSError) as error:
        message = f"HTTP {error.code}" if isinstance(error, urllib.error.HTTPError) else str(error)
        WebhookDelivery.objects.filter(pk=delivery_id).update(last_error=message[:1000])
        raise WebhookFailed(
            f"delivery {delivery_id} to {delivery.endpoint.url}: {message}"
        ) from None
    WebhookDelivery.objects.filter(pk=delivery_id).update(
        delivered_at=timezone.now(), last_error=""
    )
    return True
