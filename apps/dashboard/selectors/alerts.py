"""The alert lists of the overview, the run and node pages and the alerts page."""

from __future__ import annotations

from apps.alerts.choices import OPEN_STATES
from apps.alerts.models import Alert
from apps.clusters.models import Cluster

OVERVIEW_ALERTS = 10
PAGE_ALERTS = 50
ALERTS_PAGE_LIMIT = 200


def open_alerts(*, cluster: Cluster) -> list[Alert]:
    return list(
        Alert.objects.filter(cluster=cluster, state__in=OPEN_STATES)
        .select_related("cluster", "run", "node", "acknowledged_by")
        .order_by("-opened_at", "-id")
    )


def alerts_filtered(
    *,
    cluster: Cluster | None = None,
    kind: str = "",
    state: str = "",
    run: str = "",
    node: str = "",
    limit: int = ALERTS_PAGE_LIMIT,
    visible: list[Cluster] | None = None,
) -> list[Alert]:
    """Alerts newest first, narrowed by any of the given filters (empty: no filter), of the
    `visible` clusters only when given."""
    alerts = Alert.objects.select_related("cluster", "run", "node", "acknowledged_by")
    if visible is not None:
        alerts = alerts.filter(cluster__in=visible)
    if cluster is not None:
        alerts = alerts.filter(cluster=cluster)
    for field, value in (("kind", kind), ("state", state), ("run__name", run)):
        if value:
            alerts = alerts.filter(**{field: value})
    if node:
        alerts = alerts.filter(node__name=node)
    return list(alerts.order_by("-opened_at", "-id")[:limit])


def alert_kinds() -> list[str]:
    return sorted(Alert.objects.values_list("kind", flat=True).distinct())
