from django.contrib import admin

from apps.access.admin_scoping import ClusterAdministeredAdmin
from apps.access.models import ClusterRole, UserToken
from apps.access.services import role_grant, role_revoke, user_token_revoke


@admin.register(ClusterRole)
class ClusterRoleAdmin(ClusterAdministeredAdmin):
    list_display = ["user", "cluster", "role"]
    list_filter = ["role", "cluster"]
    search_fields = ["user__username", "cluster__name"]

    def save_model(self, request, obj, form, change):
        # through the service, so that every grant is audited
        role_grant(user=obj.user, cluster=obj.cluster, role=obj.role, actor=request.user,
                   request=request)  # fmt: skip
        obj.pk = ClusterRole.objects.get(user=obj.user, cluster=obj.cluster).pk

    def delete_model(self, request, obj):
        role_revoke(user=obj.user, cluster=obj.cluster, actor=request.user, request=request)

    def delete_queryset(self, request, queryset):
        for grant in queryset.select_related("user", "cluster"):
            self.delete_model(request, grant)


@admin.register(UserToken)
class UserTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "prefix", "created_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["user__username", "name", "prefix"]
    # tokens are issued by `manage.py issue_user_token` (the secret is shown only there)
    readonly_fields = ["user", "name", "prefix", "digest", "created_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        revoked = sum(
            user_token_revoke(token=token, actor=request.user, request=request)
            for token in queryset.select_related("user")
        )
        self.message_user(request, f"{revoked} token(s) revoked.")
