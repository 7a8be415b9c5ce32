"""Admin pages of per-cluster settings, scoped to the clusters the user administers.

Django's model permissions say whether a staff user may open a page at all; which rows they
see and change is a question of cluster roles: a cluster `admin` manages that cluster's
roles and policies, a superuser every cluster's."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.access.selectors import clusters_administered


class ClusterAdministeredAdmin(admin.ModelAdmin):
    """For models with a `cluster` foreign key: rows of the clusters the user administers;
    the cluster field offers only those; a row of another cluster cannot be changed or
    deleted (Django answers as for a missing object)."""

    cluster_field = "cluster"

    def get_queryset(self, request: HttpRequest):
        clusters = clusters_administered(user=request.user)
        return super().get_queryset(request).filter(**{f"{self.cluster_field}__in": clusters})

    def formfield_for_foreignkey(self, db_field, request: HttpRequest, **kwargs: Any):
        if db_field.name == self.cluster_field:
            kwargs["queryset"] = clusters_administered(user=request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def _administers(self, request: HttpRequest, obj: Any = None) -> bool:
        clusters = clusters_administered(user=request.user)
        if obj is None:
            return clusters.exists()
        return clusters.filter(pk=getattr(obj, f"{self.cluster_field}_id")).exists()

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) and self._administers(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) and self._administers(request, obj)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return super().has_add_permission(request, *args) and self._administers(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and self._administers(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and self._administers(request, obj)
