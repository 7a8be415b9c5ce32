"""The Django admin, audited: every add, change and delete made through it of any
registered model is an audit entry (`admin.add`, `admin.change`, `admin.delete`).

Installed in place of "django.contrib.admin" (opsboard/settings.py INSTALLED_APPS), so the
site wraps each registered ModelAdmin, every app's alike, without touching their admin.py.
The hooks are Django's own logging calls (log_addition, log_change, log_deletions), made
once per object after a save and before a delete; a delete is recorded once it is done.
This module is imported while apps load (INSTALLED_APPS names its config): models are
imported inside the hooks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest

from apps.audit.choices import AuditAction, Outcome

PENDING = "_audit_admin_deletes"


class AuditedAdminMixin:
    """Records the admin's changes in the audit log, with the admin user, client address
    and request id, and the object's cluster when it has one. An admin whose saves and
    deletes go through services that audit them (roles, hooks, auto-cordon policies) sets
    `audited_by_services = True`: one entry per change, the service's, which says more."""

    def _audited_here(self) -> bool:
        # read through getattr: this mixin comes first in the wrapped class's MRO, so a
        # default set here would hide the ModelAdmin's own
        return not getattr(self, "audited_by_services", False)

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        logged = super().log_addition(request, obj, message)  # type: ignore[misc]
        if self._audited_here():
            _record(request, AuditAction.ADMIN_ADD, _described(obj), message)
        return logged

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        logged = super().log_change(request, obj, message)  # type: ignore[misc]
        if self._audited_here():
            _record(request, AuditAction.ADMIN_CHANGE, _described(obj), message)
        return logged

    def log_deletions(self, request: HttpRequest, queryset: Any) -> Any:
        if not self._audited_here():
            return super().log_deletions(request, queryset)  # type: ignore[misc]
        # called before the delete: the entries wait until it has happened
        pending = getattr(request, PENDING, [])
        pending.extend(_described(obj) for obj in queryset)
        setattr(request, PENDING, pending)
        return super().log_deletions(request, queryset)  # type: ignore[misc]

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        super().delete_model(request, obj)  # type: ignore[misc]
        _record_deletions(request)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        super().delete_queryset(request, queryset)  # type: ignore[misc]
        _record_deletions(request)


class AuditedAdminSite(admin.AdminSite):
    """The default admin site, each ModelAdmin registered on it audited."""

    def register(self, model_or_iterable: Any, admin_class: Any = None, **options: Any) -> None:
        base = admin_class or admin.ModelAdmin
        if not issubclass(base, AuditedAdminMixin):
            base = type(base.__name__, (AuditedAdminMixin, base), {"__module__": base.__module__})
        super().register(model_or_iterable, base, **options)


class AuditedAdminConfig(AdminConfig):
    default_site = "apps.audit.admin_site.AuditedAdminSite"


def _described(obj: Any) -> dict[str, Any]:
    from apps.clusters.models import Cluster

    opts = obj._meta
    cluster = obj if isinstance(obj, Cluster) else getattr(obj, "cluster", None)
    # the cluster as it is now: a deleted one's pk is None by the time the entry is written
    named = (
        SimpleNamespace(pk=cluster.pk, name=cluster.name) if isinstance(cluster, Cluster) else None
    )
    return {
        "target": f"{opts.app_label}.{opts.model_name}:{obj.pk}",
        "cluster": named,
        "object": str(obj)[:200],
    }


def _record_deletions(request: HttpRequest) -> None:
    for described in getattr(request, PENDING, []):
        _record(request, AuditAction.ADMIN_DELETE, described, "")
    setattr(request, PENDING, [])


def _record(request: HttpRequest, action: str, described: dict[str, Any], message: Any) -> None:
    from apps.audit.services import audit_record

    change = message if isinstance(message, list) else str(message or "")
    audit_record(
        action=action,
        outcome=Outcome.SUCCEEDED,
        actor_user=request.user,
        cluster=described["cluster"],
        target=described["target"],
        detail={"object": described["object"], "change": change},
        request=request,
    )
