"""Amber that ages (docs/actions.md, "Warnings that age"): a warning nobody acknowledged
within its cluster's `warning_age_min` escalates once, as `ageing` (notified again, counted
on the overview); acknowledging it, or silencing it for a stated time with a reason, stops
that. The age is the alert's own (since it opened), so a warning silenced for an hour that
is still unacknowledged when the silence ends ages then."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.alerts.choices import AlertEvent, AlertState
from apps.alerts.models import Alert
from apps.alerts.services.announce import alerts_announce
from apps.alerts.services.authorize import alert_act_authorize
from apps.audit.choices import AuditAction, Outcome
from apps.audit.services import audit_record
from apps.clusters.models import Cluster

SILENCE_MAX_MIN = 7 * 24 * 60  # a silence is for a stated time; a week at most

# One statement for the whole fleet: each warning past its cluster's age, not acknowledged,
# not silenced now, not aged before. The conditional UPDATE makes a second beat (or a second
# worker) find nothing left to age.
_AGE_SQL = """
UPDATE alerts_alert a SET aged_at = %(now)s
FROM clusters_cluster c
LEFT JOIN alerts_clusterdetectorconfig d ON d.cluster_id = c.id
WHERE a.cluster_id = c.id AND a.state = 'firing' AND a.severity = 'warning'
  AND a.aged_at IS NULL
  AND (a.silenced_until IS NULL OR a.silenced_until <= %(now)s)
  AND COALESCE(d.warning_age_min, %(default)s) > 0
  AND a.opened_at <= %(now)s - COALESCE(d.warning_age_min, %(default)s) * interval '1 minute'
RETURNING a.id, a.cluster_id
"""


class AlertNotFiring(Exception):
    """Only a firing alert is silenced: an acknowledged one no longer ages, a resolved one is
    over."""

    def __init__(self, alert: Alert) -> None:
        super().__init__(f"alert {alert.pk} is {alert.state}")
        self.alert = alert


def alerts_age(*, now: datetime | None = None) -> int:
    """Escalate every warning past its cluster's age, once, and announce each (webhooks, the
    live feed) on commit. Returns how many aged."""
    now = now or timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_AGE_SQL, {"now": now, "default": settings.ALERT_WARNING_AGE_MIN})
            aged = cursor.fetchall()
        by_cluster: dict[int, list[tuple[int, str | None]]] = {}
        for alert_id, cluster_id in aged:
            by_cluster.setdefault(cluster_id, []).append((alert_id, AlertEvent.AGEING))
        for cluster in Cluster.objects.filter(pk__in=list(by_cluster)):
            alerts_announce(cluster=cluster, changes=by_cluster[cluster.pk])
    return len(aged)


def alert_silence_authorize(*, user: Any, alert: Alert, reason: str, request: Any = None) -> bool:
    """Whether the user may silence the alert (operate on its cluster); a refusal is audited."""
    return alert_act_authorize(
        user=user, alert=alert, action=AuditAction.ALERT_SILENCE, reason=reason, request=request
    )


def alert_silence(
    *, alert: Alert, user: Any, minutes: int, reason: str, request: Any = None
) -> Alert:
    """Silence a firing alert for `minutes` (1 to SILENCE_MAX_MIN) with a reason: it does not
    age (nor notify as ageing) until then. Audited. AlertNotFiring when it is not firing; the
    caller checks the permission (alert_silence_authorize) and the bounds."""
    until = timezone.now() + timedelta(minutes=minutes)
    with transaction.atomic():
        moved = Alert.objects.filter(pk=alert.pk, state=AlertState.FIRING).update(
            silenced_until=until, silence_reason=reason, silenced_by=user
        )
        current = Alert.objects.select_related("cluster", "run", "node").get(pk=alert.pk)
        if not moved:
            raise AlertNotFiring(current)
        audit_record(
            action=AuditAction.ALERT_SILENCE, outcome=Outcome.SUCCEEDED, actor_user=user,
            cluster=current.cluster, target=f"alert:{current.pk}", reason=reason,
            request=request, detail={"minutes": minutes, "until": until.timestamp()},
        )  # fmt: skip
        alerts_announce(cluster=current.cluster, changes=[(current.pk, AlertEvent.SILENCED)])
    return current
