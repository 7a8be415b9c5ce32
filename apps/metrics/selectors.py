"""What a scrape reads from Postgres: gauges of the deployment's state, computed at scrape
time, so that every web process answers the same whichever process did the work.

Three statements, each served by an index: the inbox's unprocessed and quarantined rows
(partial indexes `inbox_unprocessed`, `inbox_quarantined`), the open alerts (the partial
unique `alert_one_open_per_subject`), the live commands (`command_live`), the undelivered
webhook deliveries, the rollup watermark (one row), and one row per cluster of detector passes.
Resolved alerts and finished commands are not counted: those tables only grow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection

from apps.alerts.choices import OPEN_STATES
from apps.commands.choices import LIVE_STATES


@dataclass(frozen=True)
class DeploymentState:
    inbox_backlog: int
    inbox_oldest_age_s: float | None  # by the database's clock, which set received_at
    inbox_quarantined: int
    rolled_up_at: datetime | None
    alerts: dict[str, int]
    commands: dict[str, int]
    webhooks: dict[str, int]


@dataclass(frozen=True)
class DetectorPassRow:
    cluster: str
    ran_at: datetime
    duration_s: float


_SCALARS = """
SELECT
  (SELECT count(*) FROM ingest_inboxbatch WHERE processed_at IS NULL),
  (SELECT extract(epoch FROM clock_timestamp() - min(received_at))::float8
     FROM ingest_inboxbatch WHERE processed_at IS NULL),
  (SELECT count(*) FROM ingest_inboxbatch WHERE quarantined_at IS NOT NULL),
  (SELECT rolled_up_at FROM history_watermark WHERE id = 1)
"""

_BY_STATE = """
SELECT 'alert', state, count(*) FROM alerts_alert WHERE state <> 'resolved' GROUP BY state
UNION ALL
SELECT 'command', state, count(*) FROM commands_command
  WHERE state IN ('issued', 'delivered', 'accepted') GROUP BY state
UNION ALL
SELECT 'webhook', CASE WHEN attempts >= %s THEN 'failed' ELSE 'pending' END, count(*)
  FROM alerts_webhookdelivery WHERE delivered_at IS NULL GROUP BY 2
"""


def deployment_state() -> DeploymentState:
    """The inbox, rollup, alert, command and webhook gauges (two statements)."""
    with connection.cursor() as cursor:
        cursor.execute(_SCALARS)
        backlog, oldest_age_s, quarantined, rolled_up_at = cursor.fetchone()
        cursor.execute(_BY_STATE, [settings.ALERT_WEBHOOK_ATTEMPTS])
        rows = cursor.fetchall()
    groups: dict[str, dict[str, int]] = {
        "alert": dict.fromkeys(map(str, OPEN_STATES), 0),
        "command": dict.fromkeys(map(str, LIVE_STATES), 0),
        "webhook": {"failed": 0, "pending": 0},
    }
    for group, state, count in rows:
        groups[group][state] = count
    return DeploymentState(
        inbox_backlog=backlog,
        inbox_oldest_age_s=oldest_age_s,
        inbox_quarantined=quarantined,
        rolled_up_at=rolled_up_at,
        alerts=groups["alert"],
        commands=groups["command"],
        webhooks=groups["webhook"],
    )


def detector_passes() -> list[DetectorPassRow]:
    """Each cluster's last detector pass: when it finished and how long it took."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.name, p.ran_at, p.duration_s FROM alerts_detectorpass p"
            " JOIN clusters_cluster c ON c.id = p.cluster_id ORDER BY c.name"
        )
        return [DetectorPassRow(*row) for row in cursor.fetchall()]
