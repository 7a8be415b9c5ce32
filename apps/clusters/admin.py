from django.contrib import admin

from apps.clusters.models import AgentToken, Cluster, Node


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    search_fields = ["name"]


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ["cluster", "name", "prefix", "created_at", "revoked_at"]
    list_filter = ["cluster"]
    readonly_fields = ["prefix", "digest", "created_at"]
    fields = ["cluster", "name", "prefix", "digest", "created_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # tokens are issued by `manage.py issue_token`, which shows the secret once

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        from apps.clusters.services import token_revoke

        for token in queryset:
            token_revoke(token=token, actor=request.user, request=request)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "state", "last_seen"]
    list_filter = ["cluster", "state"]
    search_fields = ["name"]
