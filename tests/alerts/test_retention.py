"""Resolved alerts go ALERTS_RETENTION_DAYS after they resolved, with their webhook
deliveries; deliveries go WEBHOOK_DELIVERIES_RETENTION_DAYS after they were created; a firing
or acknowledged alert stays however old."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from apps.alerts.models import Alert, Incident, WebhookDelivery, WebhookEndpoint
from apps.alerts.tasks import prune
from apps.clusters.models import Cluster

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC)
DAY = timedelta(days=1)


def alert(cluster: Cluster, subject: str, state: str, *, opened: datetime, resolved=None):
    return Alert.objects.create(
        cluster=cluster, kind="straggler", subject=subject, severity="warning", state=state,
        summary="slow", opened_at=opened, last_seen_at=opened, resolved_at=resolved,
    )  # fmt: skip


def delivery(endpoint: WebhookEndpoint, of: Alert, *, created: datetime, delivered=True):
    made = WebhookDelivery.objects.create(endpoint=endpoint, alert=of, event="opened", payload={})
    WebhookDelivery.objects.filter(pk=made.pk).update(
        created_at=created, delivered_at=created if delivered else None, attempts=1
    )
    return made.pk


def test_it_deletes_old_resolved_alerts_with_their_deliveries_and_old_deliveries():
    cluster = Cluster.objects.create(name="ret-alerts")
    hook = WebhookEndpoint.objects.create(cluster=cluster, url="https://hooks.example/x")
    old = NOW - 200 * DAY
    resolved_old = alert(cluster, "a", "resolved", opened=old, resolved=old + DAY)
    resolved_young = alert(cluster, "b", "resolved", opened=old, resolved=NOW - 10 * DAY)
    firing = alert(cluster, "c", "firing", opened=old)  # older than everything: stays
    acked = alert(cluster, "d", "acknowledged", opened=old)
    gone = [
        delivery(hook, resolved_old, created=NOW - 2 * DAY),  # young, but its alert goes
        delivery(hook, firing, created=NOW - 40 * DAY),
        delivery(hook, resolved_young, created=NOW - 31 * DAY, delivered=False),  # failed
    ]
    kept = [
        delivery(hook, firing, created=NOW - 2 * DAY, delivered=False),  # may still be retried
        delivery(hook, resolved_young, created=NOW - 29 * DAY),
    ]
    # an incident goes with its last alert; one whose alert stays, stays
    emptied = incident(cluster, resolved_old, root=True)
    still = incident(cluster, resolved_young)

    result = prune()
    with connection.cursor() as cursor:  # the deferred foreign keys hold (as at a commit)
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")

    alerts = set(Alert.objects.filter(cluster=cluster).values_list("pk", flat=True))
    assert alerts == {resolved_young.pk, firing.pk, acked.pk}
    deliveries = set(WebhookDelivery.objects.values_list("pk", flat=True))
    assert deliveries & set(gone) == set()
    assert deliveries >= set(kept)
    assert result == {"alerts": 1, "incidents": 1, "deliveries": 2}
    assert set(Incident.objects.values_list("pk", flat=True)) == {still.pk}
    assert not Incident.objects.filter(pk=emptied.pk).exists()


def incident(cluster: Cluster, of: Alert, *, root: bool = False) -> Incident:
    made = Incident.objects.create(
        cluster=cluster, state="resolved", opened_at=of.opened_at, resolved_at=of.resolved_at,
        root_kind=of.kind, root_alert=of.pk if root else None,
    )  # fmt: skip
    Alert.objects.filter(pk=of.pk).update(incident=made)
    return made


def test_zero_keeps_them_forever(settings):
    settings.ALERTS_RETENTION_DAYS = 0
    settings.WEBHOOK_DELIVERIES_RETENTION_DAYS = 0
    cluster = Cluster.objects.create(name="ret-alerts-0")
    hook = WebhookEndpoint.objects.create(cluster=cluster, url="https://hooks.example/x")
    old = NOW - 900 * DAY
    resolved = alert(cluster, "a", "resolved", opened=old, resolved=old)
    kept = delivery(hook, resolved, created=old)
    assert prune() == {"alerts": 0, "incidents": 0, "deliveries": 0}
    assert Alert.objects.filter(pk=resolved.pk).exists()
    assert WebhookDelivery.objects.filter(pk=kept).exists()
