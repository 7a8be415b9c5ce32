"""The clusters' admin pages, as display settings only.

They are registered by apps.access.admin (Cluster, AgentToken) and apps.commands.admin
(Node, with its actions) on top of apps.access.admin_scoping.ClusterScopedAdmin: the cluster
roles that scope them sit above this app in the import layers, and a page registered here
would show every cluster's rows."""

from django.contrib import admin


class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    search_fields = ["name"]


class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ["cluster", "name", "prefix", "acts_for", "created_at", "revoked_at"]
    list_filter = ["cluster"]
    # revoking goes through the action (apps.clusters.services.token_revoke), not the form;
    # the nodes a token acts for are fixed at issue: widening them is a new token
    readonly_fields = ["prefix", "digest", "acts_for", "created_at", "revoked_at"]
    fields = ["cluster", "name", "prefix", "digest", "acts_for", "created_at", "revoked_at"]

    @admin.display(description="acts for")
    def acts_for(self, token) -> str:
        return ", ".join(token.nodes) if token.nodes else "every node (cluster-wide)"

    def has_add_permission(self, request) -> bool:
        return False  # tokens are issued by `manage.py issue_token`, which shows the secret once


class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "state", "last_seen"]
    list_filter = ["cluster", "state"]
    search_fields = ["name"]
