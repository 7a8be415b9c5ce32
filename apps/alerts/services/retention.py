"""Retention of alerts and their webhook deliveries (docs/operations.md, Retention).

Only resolved alerts ever go: a firing or acknowledged one stays however old, its condition
may still hold. A resolved alert goes ALERTS_RETENTION_DAYS after it resolved, together with
its deliveries (one statement a batch). A delivery goes WEBHOOK_DELIVERIES_RETENTION_DAYS
after it was created, delivered or not: none is attempted after a day (the task's retries
end within the hour, the sweep looks back a day), so by then each has delivered or failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from apps.alerts.choices import AlertState
from apps.core.prune import batches_delete, expired_delete

# Deliveries reference alerts (Django's CASCADE is not the database's): both in one statement.
RESOLVED_SQL = f"""
WITH doomed AS (
  SELECT id FROM alerts_alert
  WHERE state = '{AlertState.RESOLVED.value}' AND resolved_at < %(cutoff)s
  LIMIT %(batch)s
), deliveries AS (
  DELETE FROM alerts_webhookdelivery d USING doomed WHERE d.alert_id = doomed.id
)
DELETE FROM alerts_alert a USING doomed WHERE a.id = doomed.id
"""


# An incident goes with its last alert: resolved past the retention, none of its alerts left.
INCIDENTS_EXPIRED = (
    "state = 'resolved' AND resolved_at < %(cutoff)s AND NOT EXISTS"
    " (SELECT 1 FROM alerts_alert a WHERE a.incident_id = alerts_incident.id)"
)


@dataclass
class AlertsPruned:
    alerts: int = 0
    incidents: int = 0
    deliveries: int = 0  # by their own age (those of deleted alerts are not counted)


def alerts_prune(*, now: datetime) -> AlertsPruned:
    """Delete resolved alerts past ALERTS_RETENTION_DAYS with their deliveries (and the
    resolved incidents they leave empty), then
    deliveries past WEBHOOK_DELIVERIES_RETENTION_DAYS (0: kept forever), in bounded batches."""
    result = AlertsPruned()
    if days := settings.ALERTS_RETENTION_DAYS:
        result.alerts = batches_delete(
            sql=RESOLVED_SQL,
            params={"cutoff": now - timedelta(days=days)},
            what="resolved alerts",
        )
        result.incidents = expired_delete(
            table="alerts_incident",
            expired=INCIDENTS_EXPIRED,
            params={"cutoff": now - timedelta(days=days)},
        )
    if days := settings.WEBHOOK_DELIVERIES_RETENTION_DAYS:
        result.deliveries = expired_delete(
            table="alerts_webhookdelivery",
            expired="created_at < %(cutoff)s",
            params={"cutoff": now - timedelta(days=days)},
        )
    return result
