"""The access admin (roles, personal tokens), and the scoped registration of the models of
the apps below access in the import layers (clusters, audit) and of Django's and axes'
account models: every registered page derives from ClusterScopedAdmin."""

import axes.admin  # noqa: F401  (registers its models first, so they can be replaced)
import django.contrib.auth.admin  # noqa: F401  (the same for User and Group)
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from apps.access.admin_scoping import (
    ADMINISTERED,
    SUPERUSER,
    SUPERUSERS_ONLY,
    VIEWED_ADMINISTERED,
    ClusterScopedAdmin,
    is_superuser,
)
from apps.access.models import ClusterRole, UserToken
from apps.access.services import role_grant, role_move, role_revoke, user_token_revoke
from apps.audit.admin import AuditEntryAdmin
from apps.audit.models import AuditEntry
from apps.clusters.admin import AgentTokenAdmin, ClusterAdmin
from apps.clusters.models import AgentToken, Cluster
from apps.clusters.services import token_revoke


@admin.register(ClusterRole)
class ClusterRoleAdmin(ClusterScopedAdmin):
    scope_roles = ADMINISTERED
    audited_by_services = True  # role_grant / role_move / role_revoke write the entries
    list_display = ["user", "cluster", "role"]
    list_filter = ["role", "cluster"]
    search_fields = ["user__username", "cluster__name"]

    def save_model(self, request, obj, form, change):
        # through the services, so that every grant is audited; a new user on the row moves
        # the role: the old user's access ends (a revoke), not only the new one's begins
        if change:
            grant = role_move(grant=obj, user=obj.user, role=obj.role, actor=request.user,
                              request=request)  # fmt: skip
        else:
            grant = role_grant(user=obj.user, cluster=obj.cluster, role=obj.role,
                               actor=request.user, request=request)  # fmt: skip
        obj.pk = grant.pk

    def delete_model(self, request, obj):
        role_revoke(user=obj.user, cluster=obj.cluster, actor=request.user, request=request)

    def delete_queryset(self, request, queryset):
        for grant in queryset.select_related("user", "cluster"):
            self.delete_model(request, grant)


@admin.register(UserToken)
class UserTokenAdmin(ClusterScopedAdmin):
    """A personal token belongs to a user, not a cluster: a user sees and revokes their own
    (a superuser: everyone's)."""

    cluster_path = None
    list_display = ["user", "name", "prefix", "created_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["user__username", "name", "prefix"]
    # tokens are issued by `manage.py issue_user_token` (the secret is shown only there)
    readonly_fields = ["user", "name", "prefix", "digest", "created_at", "revoked_at"]
    actions = ["revoke"]

    def scope_queryset(self, request, queryset, permission):
        return queryset if is_superuser(request.user) else queryset.filter(user=request.user)

    def scope_allows(self, request, permission, obj=None) -> bool:
        return is_superuser(request.user) or obj is None or obj.user_id == request.user.pk

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        mine = self.scope_queryset(request, queryset, "change")
        revoked = sum(
            user_token_revoke(token=token, actor=request.user, request=request)
            for token in mine.select_related("user")
        )
        self.message_user(request, f"{revoked} token(s) revoked.")


@admin.register(Cluster)
class ScopedClusterAdmin(ClusterScopedAdmin, ClusterAdmin):
    """A cluster's admins may rename it; creating one, or deleting one with everything it
    holds, is a superuser's."""

    cluster_path = "pk"
    scope_roles = {**VIEWED_ADMINISTERED, "add": SUPERUSER, "delete": SUPERUSER}


@admin.register(AgentToken)
class ScopedAgentTokenAdmin(ClusterScopedAdmin, AgentTokenAdmin):
    """A cluster's agent tokens, for its admins (as `manage.py issue_token`'s tokens are)."""

    scope_roles = ADMINISTERED
    actions = ["revoke"]

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        tokens = list(self.scope_queryset(request, queryset, "change"))
        for token in tokens:
            token_revoke(token=token, actor=request.user, request=request)
        self.message_user(request, f"{len(tokens)} token(s) revoked.")


@admin.register(AuditEntry)
class ScopedAuditEntryAdmin(ClusterScopedAdmin, AuditEntryAdmin):
    """The entries of the clusters the user administers; entries of no cluster (personal
    tokens, say) are a superuser's, as in the audit API."""

    cluster_path = "cluster_id"
    scope_roles = ADMINISTERED


class SuperusersOnlyAdmin(ClusterScopedAdmin):
    """For models of no cluster whose admin comes from elsewhere (mixed in before it)."""

    cluster_path = None
    scope_roles = SUPERUSERS_ONLY


# Accounts and login throttling belong to no cluster: superusers only. A staff user who could
# edit accounts could make themselves a superuser, past every cluster role.
for _model in [get_user_model(), Group, AccessAttempt, AccessLog, AccessFailureLog]:
    if admin.site.is_registered(_model):  # axes registers only with AXES_ENABLE_ADMIN
        _base = type(admin.site.get_model_admin(_model))
        admin.site.unregister(_model)
        admin.site.register(
            _model, type(f"SuperusersOnly{_base.__name__}", (SuperusersOnlyAdmin, _base), {})
        )
