"""Reads for alerting: alerts as contract JSON, detector settings, and (in `window`) the
detectors' window of a cluster."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet

from apps.alerts.choices import OPEN_STATES, PERIODIC_SKIPS_KEY
from apps.alerts.models import Alert, ClusterDetectorConfig, DetectorPass
from apps.alerts.selectors.window import cluster_window, run_window, ts
from apps.clusters.models import Cluster
from detectors.config import DEFAULT_CONFIG, DetectorConfig

logger = logging.getLogger(__name__)

ALERT_LIST_LIMIT = 1000
# The overview flags the detectors as late after this many evaluation periods without a pass.
LATE_PERIODS = 3


def alert_json(alert: Alert) -> dict[str, Any]:
    """The contract's alert object (GET /api/v1/alerts), exactly: no more, no fewer keys."""
    return {
        "id": alert.id,
        "kind": alert.kind,
        "severity": alert.severity,
        "state": alert.state,
        "run": alert.run.name if alert.run_id else None,
        "node": alert.node.name if alert.node_id else None,
        "rank": alert.rank,
        "gpu": alert.gpu,
        "summary": alert.summary,
        "evidence": alert.evidence,
        "opened_at": ts(alert.opened_at),
        "acknowledged_at": ts(alert.acknowledged_at),
        "resolved_at": ts(alert.resolved_at),
        "incident": alert.incident_id,
        # an extension (amber that ages): when an unacknowledged warning escalated for its
        # age, and an operator's silence of it
        "aged_at": ts(alert.aged_at),
        "silenced_until": ts(alert.silenced_until),
        "silence_reason": alert.silence_reason,
    }


def alert_get(*, alert_id: int, visible: QuerySet | None = None) -> Alert | None:
    """The alert, if it is of one of the `visible` clusters (None: of any cluster)."""
    alerts = Alert.objects.select_related("run", "node", "cluster").filter(pk=alert_id)
    if visible is not None:
        alerts = alerts.filter(cluster__in=visible)
    return alerts.first()


def alert_list(
    *,
    cluster: Cluster | None,
    run: str | None = None,
    node: str | None = None,
    state: str | None = None,
    since: float | None = None,
    limit: int = ALERT_LIST_LIMIT,
    visible: QuerySet | None = None,
) -> list[Alert]:
    """Alerts newest first (of every cluster when `cluster` is None; of the `visible`
    clusters only, when given). `since` keeps the alerts that changed state (opened,
    acknowledged, resolved) at or after it."""
    alerts: QuerySet[Alert] = Alert.objects.select_related("run", "node")
    if visible is not None:
        alerts = alerts.filter(cluster__in=visible)
    if cluster is not None:
        alerts = alerts.filter(cluster=cluster)
    if run is not None:
        alerts = alerts.filter(run__name=run)
    if node is not None:
        alerts = alerts.filter(node__name=node)
    if state is not None:
        alerts = alerts.filter(state=state)
    if since is not None:
        at = datetime.fromtimestamp(since, UTC)
        alerts = alerts.filter(
            Q(opened_at__gte=at) | Q(acknowledged_at__gte=at) | Q(resolved_at__gte=at)
        )
    return list(alerts.order_by("-opened_at", "-id")[:limit])


def detector_config(*, cluster: Cluster) -> DetectorConfig:
    """The detector thresholds of a cluster: the defaults with its stored overrides."""
    stored = ClusterDetectorConfig.objects.filter(cluster=cluster).first()
    if stored is None or not stored.overrides:
        return DEFAULT_CONFIG
    try:
        return DEFAULT_CONFIG.with_overrides(stored.overrides)
    except (ValueError, TypeError, AttributeError):
        logger.warning("invalid detector overrides of cluster %s ignored", cluster.name)
        return DEFAULT_CONFIG


def detector_pass_status(*, cluster: Cluster, now: float) -> dict[str, Any] | None:
    """When the cluster's detectors last ran and how long that took, for the overview:
    `late` once the pass is more than LATE_PERIODS evaluation periods old. None before the
    first pass."""
    last = DetectorPass.objects.filter(cluster=cluster).first()
    if last is None:
        return None
    age = max(0.0, now - last.ran_at.timestamp())
    return {
        "ran_at": last.ran_at.timestamp(),
        "age_s": age,
        "duration_s": last.duration_s,
        "findings": last.findings,
        "skipped": last.skipped,  # passes skipped since its first (still running, expired)
        "late": age > LATE_PERIODS * settings.ALERT_EVALUATE_INTERVAL,
    }


def periodic_skips() -> dict[str, int]:
    """Periodic passes that did not run, as "<task>:<reason>" → count (reason: `expired` in
    the queue, or `overlap` with a pass still running); see opsboard.celery."""
    from apps.core.redis import redis_client

    counts = redis_client().hgetall(PERIODIC_SKIPS_KEY.format(prefix=settings.REDIS_PREFIX))
    return {
        (key.decode() if isinstance(key, bytes) else key): int(value)
        for key, value in counts.items()
    }


def clusters_to_evaluate(*, now: float) -> list[Cluster]:
    """Clusters that sent data recently, or that have open alerts (which must resolve),
    unless their continuous evaluation is paused (ClusterDetectorConfig.paused)."""
    recent = datetime.fromtimestamp(now - settings.ALERT_IDLE_S, UTC)
    return list(
        Cluster.objects.filter(Q(nodes__last_seen__gte=recent) | Q(alerts__state__in=OPEN_STATES))
        .exclude(detector_config__paused=True)
        .distinct()
    )


__all__ = [
    "ALERT_LIST_LIMIT",
    "alert_get",
    "alert_json",
    "alert_list",
    "cluster_window",
    "clusters_to_evaluate",
    "detector_config",
    "detector_pass_status",
    "periodic_skips",
    "run_window",
    "ts",
]
