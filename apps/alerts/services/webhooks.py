"""Outgoing webhooks of alert changes: the body per endpoint format, delivery and the sweep
of deliveries never enqueued."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from django.conf import settings
from django.db.models import Exists, F, OuterRef
from django.urls import reverse
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from apps.alerts.choices import WebhookFormat
from apps.alerts.models import Alert, WebhookDelivery, WebhookEndpoint
from apps.alerts.selectors import alert_json
from apps.core.tasks import task_enqueue

logger = logging.getLogger(__name__)

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


def webhook_body(
    *,
    fmt: str,
    event: str,
    cluster: str,
    alert: Mapping[str, Any],
    incident: Mapping[str, Any] | None = None,
) -> dict | list:
    """The body posted to an endpoint: the contract's alert object with the event name, for
    Slack-compatible endpoints a {"text": ...} message, for an Alertmanager its alert list.
    `incident` (the contract's incident object and `folded`, its alerts in words) is what an
    incident's notification names: its root cause and what it folded."""
    if fmt == WebhookFormat.ALERTMANAGER:
        body = alertmanager_alert(cluster=cluster, alert=alert)
        if incident is not None:
            body["annotations"]["folded"] = folded_text(incident)
        return [body]
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
        if incident is not None and len(incident["folded"]) > 1:
            text += f". Incident {incident['id']}: {folded_text(incident)}"
        # Names and summaries come from agents: `<!channel>` in a node name must not ping.
        return {"text": slack_escape(text)}
    return {"event": event, "cluster": cluster, "alert": dict(alert), "incident": incident}


def folded_text(incident: Mapping[str, Any]) -> str:
    """The incident's root cause and the alerts it folded, in one line."""
    root = incident["root_cause"]
    if root is None:
        kinds = ", ".join(c["kind"] for c in incident["candidates"])
        cause = f"root cause unknown (candidates: {kinds})"
    else:
        where = ", ".join(f"{k} {root[k]}" for k in ("node", "gpu", "rank") if root[k] is not None)
        cause = f"root cause {root['kind']}{f' ({where})' if where else ''}"
    folded = "; ".join(f"{a['kind']} #{a['id']}" for a in incident["folded"])
    return f"{cause}; folds {len(incident['folded'])} alerts: {folded}"


def alertmanager_alert(*, cluster: str, alert: Mapping[str, Any]) -> dict[str, Any]:
    """One alert as Alertmanager's POST /api/v2/alerts takes it (docs/operations.md).

    Labels identify it (`alertname` is the kind; `opsboard_alert` keeps two alerts of one kind
    on one node apart) and are what Alertmanager groups, routes and silences on. `endsAt` is
    set when the alert resolves; an acknowledged alert still fires (silence it in Alertmanager
    to stop its pages). While it fires, it is sent again every ALERTMANAGER_RESEND_S, within
    Alertmanager's resolve_timeout (alertmanager_resend)."""
    labels = {
        "alertname": alert["kind"],
        "cluster": cluster,
        "severity": alert["severity"],
        "opsboard_alert": str(alert["id"]),
    }
    for name in ("node", "run", "rank", "gpu"):
        if alert[name] is not None:
            labels[name] = str(alert[name])
    if alert.get("incident") is not None:  # the same on the first post and every resend
        labels["opsboard_incident"] = str(alert["incident"])
    url = settings.OPSBOARD_URL.rstrip("/") + reverse("alert-detail", args=[alert["id"]])
    body: dict[str, Any] = {
        "labels": labels,
        "annotations": {"summary": alert["summary"], "opsboard_url": url, "runbook_url": url},
        "startsAt": _rfc3339(alert["opened_at"]),
        "generatorURL": url,
    }
    if alert["resolved_at"] is not None:
        body["endsAt"] = _rfc3339(alert["resolved_at"])
    if alert.get("aged_at") is not None:  # amber that aged: unacknowledged past the limit
        body["annotations"]["opsboard_ageing"] = _rfc3339(alert["aged_at"])
    return body


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def alertmanager_resend(*, limit: int = 1000) -> int:
    """Post every firing alert again to the Alertmanager endpoints of its cluster (one POST
    per endpoint): Alertmanager resolves an alert it has not heard of for resolve_timeout.
    Returns how many alerts were sent; an endpoint that fails is tried at the next pass."""
    sent = 0
    endpoints = WebhookEndpoint.objects.filter(
        active=True, format=WebhookFormat.ALERTMANAGER
    ).select_related("cluster")
    for endpoint in endpoints:
        # an incident pages once, by its lead (first) alert: its symptoms stay out
        folded = Alert.objects.filter(incident_id=OuterRef("incident_id"), pk__lt=OuterRef("pk"))
        firing = (
            Alert.objects.select_related("run", "node")
            .filter(cluster=endpoint.cluster, resolved_at__isnull=True)
            .exclude(Exists(folded))
            .order_by("pk")[:limit]
        )
        body = [
            alertmanager_alert(cluster=endpoint.cluster.name, alert=alert_json(a)) for a in firing
        ]
        if not body:
            continue
        try:
            _post(endpoint.url, body)
        except (urllib.error.URLError, OSError) as error:
            logger.warning("alertmanager resend to %s failed: %s", endpoint.url, error)
            continue
        sent += len(body)
    return sent


def _post(url: str, body: Any, secret: str = "", delivery_id: int | None = None) -> None:
    """POST `body` as JSON, signed with `secret` by the Standard Webhooks scheme (its
    webhook-id names the delivery, the same on every retry, so a receiver can drop a repeat)."""
    data = orjson.dumps(body)
    headers = {"Content-Type": "application/json", "User-Agent": "Opsboard-alerts/1"}
    if secret:
        message_id = f"opsboard-delivery-{delivery_id}"
        now = datetime.now(UTC)
        headers |= {
            "webhook-id": message_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(secret).sign(message_id, now, data),
        }
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=settings.ALERT_WEBHOOK_TIMEOUT_S):
        pass  # urlopen raises HTTPError for any status >= 400


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
    try:
        _post(
            delivery.endpoint.url, delivery.payload, delivery.endpoint.signing_secret, delivery_id
        )
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
