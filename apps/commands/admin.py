from django.contrib import admin

from apps.commands.models import ClusterHooks, Command, CommandTransition


class TransitionInline(admin.TabularInline):
    model = CommandTransition
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "at", "detail"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Command)
class CommandAdmin(admin.ModelAdmin):
    """Read-only: commands are issued and moved only through apps.commands.services."""

    list_display = ["issued_at", "cluster", "kind", "run", "node", "state", "issued_by"]
    list_filter = ["cluster", "kind", "state"]
    inlines = [TransitionInline]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ClusterHooks)
class ClusterHooksAdmin(admin.ModelAdmin):
    list_display = ["cluster", "cordon_argv", "uncordon_argv", "drain_argv", "timeout_s"]
