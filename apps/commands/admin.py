"""The commands' admin, and the node and run admins' actions.

Node (apps.clusters) and Run (apps.runs) sit below commands in the import layers, so their
admins gain their actions here: this module registers Node's (scoped by cluster roles here:
apps.clusters sits below apps.access) and re-registers Run's with the actions added. Each
action asks for a reason on a confirmation page (Django's delete-confirmation pattern) and
then issues a command through apps.commands.services.command_issue as the admin user, the
API's own path: the role check, the audit entry (allowed or denied), the scheduler hook."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from apps.access.admin_scoping import ADMINISTERED, SUPERUSERS_ONLY, ClusterScopedAdmin
from apps.audit.services import audit_record
from apps.clusters.admin import NodeAdmin
from apps.clusters.models import Node
from apps.commands.choices import CONFIRMED_KINDS, REASON_MAX_LENGTH, CommandKind, CommandState
from apps.commands.models import AutoCordonPolicy, ClusterHooks, Command, CommandTransition
from apps.commands.presets import KUBERNETES, SLURM, hooks_preset
from apps.commands.services import CommandDenied, CommandInvalid, NodeBusy, command_issue
from apps.runs.admin import RunAdmin
from apps.runs.models import Run

# Kinds that take work away: the reason is required and the names are typed again.
_NAMES_SEPARATOR = re.compile(r"[\s,]+")
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f]")


class TransitionInline(admin.TabularInline):
    model = CommandTransition
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "at", "detail"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Command)
class CommandAdmin(ClusterScopedAdmin):
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
class ClusterHooksAdmin(ClusterScopedAdmin):
    """Superusers only: a hook is a program the server runs, so configuring one is running
    code on the Opsboard host, a power above any one cluster's admin. Changes are audited."""

    scope_roles = SUPERUSERS_ONLY
    list_display = [
        "cluster", "cordon_argv", "uncordon_argv", "drain_argv", "state_argv", "timeout_s",
        "state_checked_at", "state_error",
    ]  # fmt: skip
    # the state hook's last run, written by apps.commands.services.scheduler_states
    readonly_fields = ["state_checked_at", "state_error"]
    actions = ["use_slurm", "use_kubernetes"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        _hooks_audit(request, obj)

    @admin.action(
        description="Use the ready-made Slurm hooks (scontrol, sinfo)", permissions=["change"]
    )
    def use_slurm(self, request, queryset):
        self._preset(request, queryset, SLURM)

    @admin.action(
        description="Use the ready-made Kubernetes hooks (kubectl)", permissions=["change"]
    )
    def use_kubernetes(self, request, queryset):
        self._preset(request, queryset, KUBERNETES)

    def _preset(self, request, queryset, scheduler: str) -> None:
        for hooks in queryset.select_related("cluster"):
            for field, argv in hooks_preset(scheduler).items():
                setattr(hooks, field, argv)
            hooks.save()
            _hooks_audit(request, hooks)
        self.message_user(request, f"{queryset.count()} clusters use the {scheduler} hooks")


def _hooks_audit(request, hooks: ClusterHooks) -> None:
    names = ("cordon_argv", "uncordon_argv", "drain_argv", "state_argv")
    argv = {name: getattr(hooks, name) for name in names}
    audit_record(
        action="hooks.configure", outcome="succeeded", actor_user=request.user,
        cluster=hooks.cluster, target=f"cluster:{hooks.cluster.name}",
        detail={**argv, "timeout_s": hooks.timeout_s}, request=request,
    )  # fmt: skip


@admin.register(AutoCordonPolicy)
class AutoCordonPolicyAdmin(ClusterScopedAdmin):
    """A cluster's auto-cordon policy (off unless `enabled`), for its admins; every change is
    audited."""

    scope_roles = ADMINISTERED
    audited_by_services = True  # policy.configure / policy.delete (below) say more

    list_display = ["cluster", "enabled", "on_ecc", "on_xid", "on_sdc"]
    list_filter = ["enabled"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        _policy_audit(request, obj, "policy.configure")

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        _policy_audit(request, obj, "policy.delete")

    def delete_queryset(self, request, queryset):
        for policy in queryset.select_related("cluster"):
            self.delete_model(request, policy)


def _policy_audit(request: HttpRequest, policy: AutoCordonPolicy, action: str) -> None:
    values = {name: getattr(policy, name) for name in ("enabled", "on_ecc", "on_xid", "on_sdc")}
    audit_record(
        action=action, outcome="succeeded", actor_user=request.user, cluster=policy.cluster,
        target=f"cluster:{policy.cluster.name}", detail={"auto_cordon": values},
        request=request,
    )  # fmt: skip


class CommandActionForm(forms.Form):
    """The confirmation page's form. `token` is the idempotency token of this rendering: a
    double submit issues each command once."""

    token = forms.UUIDField(widget=forms.HiddenInput)
    reason = forms.CharField(
        max_length=REASON_MAX_LENGTH, required=False, widget=forms.TextInput(attrs={"size": 80})
    )

    def __init__(self, *args: Any, kind: str, names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.names = names
        if kind in CONFIRMED_KINDS:
            self.fields["reason"].required = True
            self.fields["confirm"] = forms.CharField(
                strip=False,
                label="Type the name(s) again to confirm",
                help_text=" ".join(names),
            )

    def clean_reason(self) -> str:
        reason = self.cleaned_data["reason"]
        if _CONTROL_CHARACTERS.search(reason):  # it reaches scheduler hooks as an argument
            raise forms.ValidationError("The reason cannot hold control characters.")
        return reason

    def clean_confirm(self) -> str:
        typed = self.cleaned_data["confirm"]
        if sorted(name for name in _NAMES_SEPARATOR.split(typed) if name) != sorted(self.names):
            raise forms.ValidationError("Type each selected name exactly, separated by spaces.")
        return typed


def command_action(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, *, kind: str
) -> TemplateResponse | None:
    """Confirm, then issue one `kind` command per selected node or run; the outcome of each
    is a message on the changelist."""
    objects = list(queryset.select_related("cluster").order_by("cluster__name", "name"))
    if not objects:  # none of the selected rows is in the user's scope
        modeladmin.message_user(request, "No selected item can be acted on.", messages.WARNING)
        return None
    names = [obj.name for obj in objects]
    applying = request.POST.get("apply") == "yes"
    form = CommandActionForm(
        request.POST if applying else None,
        kind=kind,
        names=names,
        initial={"token": uuid.uuid4()},
    )
    if applying and form.is_valid():
        for obj in objects:
            _issue(modeladmin, request, obj, kind=kind, data=form.cleaned_data)
        return None
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"{kind.capitalize()} the selected {opts.verbose_name_plural}",
        "kind": kind,
        "action": kind,
        "objects_name": opts.verbose_name_plural,
        "queryset": objects,
        "form": form,
        "opts": opts,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "media": modeladmin.media,
    }
    return TemplateResponse(request, "admin/commands/command_confirm.html", context)


def _issue(modeladmin, request, obj: Node | Run, *, kind: str, data: dict[str, Any]) -> None:
    target = {"node": obj} if isinstance(obj, Node) else {"run": obj}
    try:
        command, created = command_issue(
            user=request.user,
            cluster=obj.cluster,
            kind=kind,
            reason=data["reason"],
            idempotency_key=f"admin:{data['token']}:{kind}:{obj.pk}",
            request=request,
            **target,
        )
    except (CommandDenied, CommandInvalid, NodeBusy) as refused:
        modeladmin.message_user(request, f"{kind} {obj}: {refused}", messages.ERROR)
        return
    level = messages.ERROR if command.state == CommandState.FAILED else messages.SUCCESS
    again = "" if created else " (already issued)"
    modeladmin.message_user(request, f"{kind} {obj}: {command.state}{again}", level)


def _action(kind: str, description: str):
    def action(modeladmin, request, queryset):
        return command_action(modeladmin, request, queryset, kind=kind)

    action.__name__ = str(kind)  # the action's name in the changelist's form
    # view is enough to see the action: whether it may be done is the cluster role's say
    return admin.action(description=description, permissions=["view"])(action)


@admin.register(Node)
class NodeCommandAdmin(ClusterScopedAdmin, NodeAdmin):
    """The node admin with cordon, uncordon and drain. The node's state and cordon fields
    are read-only: set here they would skip the audit log and the scheduler hook (the
    actions go through command_issue, which calls node_cordon / node_uncordon)."""

    actions = [
        _action(CommandKind.CORDON, "Cordon the selected nodes"),
        _action(CommandKind.UNCORDON, "Uncordon the selected nodes"),
        _action(CommandKind.DRAIN, "Drain the selected nodes"),
    ]
    readonly_fields = ["state", "cordon_reason", "cordoned_at", "cordoned_by"]


admin.site.unregister(Run)


@admin.register(Run)
class RunCommandAdmin(RunAdmin):
    """The run admin (scoped in apps.runs.admin) with checkpoint now, stop and resume (from
    the run's plan)."""

    actions = [
        _action(CommandKind.CHECKPOINT, "Checkpoint the selected runs now"),
        _action(CommandKind.STOP, "Stop the selected runs"),
        _action(CommandKind.RESUME, "Resume the selected runs (from their plan)"),
    ]
