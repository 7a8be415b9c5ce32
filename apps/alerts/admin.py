from django.contrib import admin

from apps.access.admin_scoping import ADMINISTERED, ClusterScopedAdmin
from apps.alerts.models import (
    Alert,
    ClusterDetectorConfig,
    WebhookDelivery,
    WebhookEndpoint,
)


@admin.register(Alert)
class AlertAdmin(ClusterScopedAdmin):
    list_display = ["opened_at", "kind", "severity", "state", "cluster", "subject", "summary"]
    list_filter = ["state", "severity", "kind", "cluster"]
    search_fields = ["subject", "summary"]
    list_select_related = ["cluster"]
    # Alerts change through the detectors and the acknowledge action, not by hand.
    readonly_fields = [f.name for f in Alert._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


class WebhookDeliveryInline(admin.TabularInline):
    model = WebhookDelivery
    fields = ["created_at", "event", "alert", "attempts", "delivered_at", "last_error"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["-created_at"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ClusterScopedAdmin):
    """A cluster's webhooks, for its admins (a Slack URL is a secret)."""

    scope_roles = ADMINISTERED
    list_display = ["url", "cluster", "format", "active", "created_at"]
    list_filter = ["format", "active", "cluster"]
    inlines = [WebhookDeliveryInline]


@admin.register(ClusterDetectorConfig)
class ClusterDetectorConfigAdmin(ClusterScopedAdmin):
    list_display = ["cluster", "paused", "overrides"]
