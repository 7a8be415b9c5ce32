from django.contrib import admin

from apps.runs.models import Run, RunEvent


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "state", "last_step", "world_size", "last_step_at"]
    list_filter = ["cluster", "state"]
    search_fields = ["name"]


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ["ts", "kind", "node", "run", "step", "rank", "gpu"]
    list_filter = ["kind"]
