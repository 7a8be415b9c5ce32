from django.contrib import admin

from apps.telemetry.models import Metric, NodeHealth


@admin.register(Metric)
class MetricAdmin(admin.ModelAdmin):
    search_fields = ["name"]


@admin.register(NodeHealth)
class NodeHealthAdmin(admin.ModelAdmin):
    list_display = ["node", "gpu", "ts"]
    list_filter = ["node__cluster"]
