"""Every admin page scoped by the user's cluster roles, as the pages are.

Django's model permissions say whether a staff user may open a page at all; which rows they
see and change is a question of cluster roles (apps.access.selectors). Each ModelAdmin
derives from `ClusterScopedAdmin` and names the path from its model to the cluster
(`cluster_path`) and the role each permission needs on that cluster (`scope_roles`). From
those two, this one class scopes:

- the changelist, and with it search, the date hierarchy, the full count and the actions
  (Django hands an action only rows of `get_queryset`);
- the change, delete and history pages: another cluster's object is `404`, as on the pages;
  an object of the user's cluster that their role may not change or delete is `403`;
- the filters' choices (relational filters list only values of the scoped rows);
- the foreign-key choices of forms (clusters, nodes, runs, tokens of the clusters the user
  may write to) and, through the related model's own admin, raw-id and autocomplete lookups;
- the `cluster` field itself, read-only once an object exists (an object never moves).

A superuser (active) sees and may do everything, as in apps.access.selectors. Models without
a cluster (accounts, login throttling, the metric dictionary) are for superusers only,
unless their admin scopes them otherwise (personal tokens: their owner)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from django.contrib import admin
from django.contrib.admin.utils import get_fields_from_path
from django.core.exceptions import FieldDoesNotExist, PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest

from apps.access.choices import Action
from apps.access.selectors import clusters_allowing

# A scope role no cluster role reaches: superusers only.
SUPERUSER = "superuser"

PERMISSIONS = ("view", "add", "change", "delete")
# The default: anyone with a role on the cluster reads, its admins write (as the pages).
VIEWED_ADMINISTERED: Mapping[str, str] = {
    "view": Action.VIEW,
    "add": Action.ADMINISTER,
    "change": Action.ADMINISTER,
    "delete": Action.ADMINISTER,
}
ADMINISTERED: Mapping[str, str] = dict.fromkeys(PERMISSIONS, Action.ADMINISTER)
SUPERUSERS_ONLY: Mapping[str, str] = dict.fromkeys(PERMISSIONS, SUPERUSER)


def is_superuser(user: Any) -> bool:
    return bool(user.is_active and user.is_superuser)


class ClusterScopedAdmin(admin.ModelAdmin):
    """The base of every ModelAdmin of the project (tests/access/test_admin_every_model.py
    walks the registry and checks each). Override `cluster_path` and `scope_roles`; a model
    scoped by something other than a cluster overrides `scope_queryset` and `scope_allows`."""

    # The ORM path from the model to its cluster's id ("cluster", "node__cluster",
    # "pk" for Cluster itself); None: no cluster, superusers only.
    cluster_path: ClassVar[str | None] = "cluster"
    # The role needed on the object's cluster for each Django permission
    # (an apps.access.choices.Action, or SUPERUSER).
    scope_roles: ClassVar[Mapping[str, str]] = VIEWED_ADMINISTERED

    # -- the scope ------------------------------------------------------------------------

    def scope_queryset(self, request: HttpRequest, queryset: QuerySet, permission: str):
        """`queryset` narrowed to the rows on which the user holds `permission`'s role."""
        if is_superuser(request.user):
            return queryset
        role = self.scope_roles[permission]
        if role == SUPERUSER or self.cluster_path is None:
            return queryset.none()
        clusters = clusters_allowing(user=request.user, action=role).values("pk")
        return queryset.filter(**{f"{self.cluster_path}__in": clusters})

    def scope_allows(self, request: HttpRequest, permission: str, obj: Any = None) -> bool:
        """Whether the user holds `permission`'s role on the object's cluster. With obj None:
        whether the page or button is offered at all, i.e. for view whether the model is
        open to cluster roles (a user without a role sees an empty list, as on the pages),
        for add, change and delete whether the user holds the role on some cluster."""
        if is_superuser(request.user):
            return True
        role = self.scope_roles[permission]
        if role == SUPERUSER or self.cluster_path is None:
            return False
        if obj is None and permission == "view":
            return True
        allowed = _cluster_ids(request, role)
        if obj is None:
            return bool(allowed)
        return _cluster_id_of(obj, self.cluster_path) in allowed

    # -- Django's hooks -------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest):
        return self.scope_queryset(request, super().get_queryset(request), "view")

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None):
        obj = super().get_object(request, object_id, from_field)
        if obj is None:  # missing, or another cluster's: the same answer, as on the pages
            raise Http404(f"No {self.opts.verbose_name} with this id.")
        return obj

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) and self.scope_allows(request, "view")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) and self.scope_allows(request, "view", obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and self.scope_allows(request, "add")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and self.scope_allows(
            request, "change", obj
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and self.scope_allows(
            request, "delete", obj
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None):
        readonly = list(super().get_readonly_fields(request, obj))
        field = self._cluster_field()
        if obj is not None and field is not None and field not in readonly:
            readonly.append(field)
        return readonly

    def formfield_for_foreignkey(self, db_field, request: HttpRequest, **kwargs: Any):
        if "queryset" not in kwargs and not is_superuser(request.user):
            related_admin = self.admin_site._registry.get(db_field.remote_field.model)
            path = getattr(related_admin, "cluster_path", None)
            if path is not None:
                # offered: the related rows of the clusters this user may write to here
                role = self.scope_roles["change"]
                clusters = (
                    clusters_allowing(user=request.user, action=role).values("pk")
                    if role != SUPERUSER
                    else []
                )
                related = db_field.remote_field.model._default_manager
                kwargs["queryset"] = related.filter(**{f"{path}__in": clusters})
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_list_filter(self, request: HttpRequest):
        # Django's related filter lists every row of the related table (every cluster's
        # name); RelatedOnlyFieldListFilter lists only those of the scoped rows.
        scoped = []
        for item in super().get_list_filter(request):
            if isinstance(item, str) and get_fields_from_path(self.model, item)[-1].is_relation:
                item = (item, admin.RelatedOnlyFieldListFilter)
            scoped.append(item)
        return scoped

    def save_form(self, request: HttpRequest, form, change: bool):
        # the form offers only in-scope choices; this also holds for a custom form
        obj = super().save_form(request, form, change)
        if not self.scope_allows(request, "change" if change else "add", obj):
            raise PermissionDenied
        return obj

    def _cluster_field(self) -> str | None:
        """The model's own foreign key to its cluster, if the path is one."""
        if self.cluster_path is None or "__" in self.cluster_path:
            return None
        try:
            field = self.model._meta.get_field(self.cluster_path)
        except FieldDoesNotExist:
            return None
        return field.name if field.is_relation else None


def _cluster_ids(request: HttpRequest, role: str) -> frozenset[int]:
    """The ids of the clusters where the request's user holds `role`, read once per request
    (a delete confirmation checks every related object)."""
    cache: dict[str, frozenset[int]] = request.__dict__.setdefault("_cluster_scope", {})
    if role not in cache:
        clusters = clusters_allowing(user=request.user, action=role)
        cache[role] = frozenset(clusters.values_list("pk", flat=True))
    return cache[role]


def _cluster_id_of(obj: Model, path: str) -> int | None:
    """The cluster id at the end of `path` ("node__cluster": obj.node.cluster_id)."""
    *hops, last = path.split("__")
    for hop in hops:
        obj = getattr(obj, hop)
        if obj is None:
            return None
    if last == "pk":
        return obj.pk
    return getattr(obj, obj._meta.get_field(last).attname)
