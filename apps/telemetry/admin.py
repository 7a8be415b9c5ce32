from django.contrib import admin

from apps.access.admin_scoping import SUPERUSERS_ONLY, ClusterScopedAdmin
from apps.telemetry.models import Metric, NodeHealth


@admin.register(Metric)
class MetricAdmin(ClusterScopedAdmin):
    """The dictionary of metric names, shared by every cluster: superusers only."""

    cluster_path = None
    scope_roles = SUPERUSERS_ONLY
    search_fields = ["name"]


@admin.register(NodeHealth)
class NodeHealthAdmin(ClusterScopedAdmin):
    """Read only: the latest values, kept by ingest."""

    cluster_path = "node__cluster"
    list_display = ["node", "gpu", "ts"]
    list_filter = ["node__cluster"]
    readonly_fields = ["node", "gpu", "ts", "values"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
