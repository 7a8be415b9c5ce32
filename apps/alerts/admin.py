from django.contrib import admin, messages

from apps.access.admin_scoping import ADMINISTERED, ClusterScopedAdmin
from apps.alerts.models import (
    Alert,
    ClusterDetectorConfig,
    Incident,
    WebhookDelivery,
    WebhookEndpoint,
    new_signing_secret,
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


@admin.register(Incident)
class IncidentAdmin(ClusterScopedAdmin):
    list_display = ["opened_at", "root_kind", "root_node", "state", "cluster", "resolved_at"]
    list_filter = ["state", "root_kind", "cluster"]
    list_select_related = ["cluster"]
    # Incidents are folded by the alert passes and acknowledged by operators, not by hand.
    readonly_fields = [f.name for f in Incident._meta.fields]

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
    actions = ["signing_secret_rotate"]

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        if not change:
            _secret_show(request, obj)

    @admin.action(description="Make a new signing secret (shown once)", permissions=["change"])
    def signing_secret_rotate(self, request, queryset) -> None:
        for endpoint in queryset:
            endpoint.signing_secret = new_signing_secret()
            endpoint.save(update_fields=["signing_secret"])
            _secret_show(request, endpoint)


def _secret_show(request, endpoint: WebhookEndpoint) -> None:
    """The signing secret, once: the receiver verifies each delivery with it (docs/operations.md,
    "Signed webhooks"); it is not shown again."""
    messages.warning(
        request,
        f"Signing secret of {endpoint.url} (copy it now, it is not shown again): "
        f"{endpoint.signing_secret}",
    )


@admin.register(ClusterDetectorConfig)
class ClusterDetectorConfigAdmin(ClusterScopedAdmin):
    list_display = ["cluster", "paused", "warning_age_min", "overrides"]
