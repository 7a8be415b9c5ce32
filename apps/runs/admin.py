from django.contrib import admin

from apps.access.admin_scoping import ClusterScopedAdmin
from apps.runs.models import Run, RunEvent


@admin.register(Run)
class RunAdmin(ClusterScopedAdmin):
    list_display = ["name", "cluster", "state", "last_step", "world_size", "last_step_at"]
    list_filter = ["cluster", "state"]
    search_fields = ["name"]
    ordering = ["cluster__name", "name"]  # the changelist, raw-id popups and autocomplete
    # Kept by ingest and the commands' services (a stop ends the run, a resume restarts it):
    # set here, a state would skip the audit log and the run's commands.
    readonly_fields = ["state", "ended_at", "end_message", "first_step", "last_step",
                       "last_step_at", "world_size", "created_at"]  # fmt: skip


@admin.register(RunEvent)
class RunEventAdmin(ClusterScopedAdmin):
    """Read only: events are what the agents reported."""

    list_display = ["ts", "kind", "node", "run", "step", "rank", "gpu"]
    list_filter = ["kind"]
    readonly_fields = [field.name for field in RunEvent._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
