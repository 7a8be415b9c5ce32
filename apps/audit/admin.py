from django.contrib import admin

from apps.audit.models import AuditEntry


class AuditEntryAdmin(admin.ModelAdmin):
    """Read only: the table refuses UPDATE and DELETE (a trigger), so the admin offers
    neither; entries are written by apps.audit.services.audit_record.

    Registered by apps.access.admin, scoped to the clusters the user administers (as the
    audit API): the cluster roles sit above this app in the import layers."""

    list_display = ["at", "actor_kind", "actor_name", "action", "cluster_name", "target",
                    "outcome"]  # fmt: skip
    list_filter = ["outcome", "actor_kind", "action", "cluster_name"]
    search_fields = ["actor_name", "target", "reason", "request_id"]
    readonly_fields = [field.name for field in AuditEntry._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
