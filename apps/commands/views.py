"""The pages' command forms (POST, CSRF) and the command lists' JSON for their live refresh.

Every post goes through apps.commands.services.command_issue, as the API's do: it checks
the role again and audits the attempt, a denied one too. Objects of a cluster the user holds
no role in are 404."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from apps.access.selectors import clusters_visible, user_may
from apps.access.services import attempt_hidden_record
from apps.clusters.models import Cluster, Node
from apps.commands import services
from apps.commands.choices import NODE_KINDS, RUN_KINDS
from apps.commands.forms import CommandForm
from apps.commands.models import Command
from apps.commands.pages import commands_rows
from apps.commands.rows import run_header
from apps.runs.models import Run

LABELS = {
    "checkpoint": "Checkpoint now",
    "stop": "Stop",
    "resume": "Resume",
    "cordon": "Cordon",
    "uncordon": "Uncordon",
    "drain": "Drain",
    "maintenance": "Send to maintenance",
}


def _cluster_or_404(request: HttpRequest, name: str) -> Cluster:
    cluster = clusters_visible(user=request.user).filter(name=name).first()
    if cluster is None:
        raise Http404("no such cluster")
    return cluster


def _run_or_404(request: HttpRequest, cluster: str, run: str) -> Run:
    return _named_or_404(Run, request, cluster, run)


def _node_or_404(request: HttpRequest, cluster: str, node: str) -> Node:
    return _named_or_404(Node, request, cluster, node)


def _named_or_404(model, request: HttpRequest, cluster: str, name: str):
    """The run or node of that name in a cluster the user sees, else 404."""
    found = model.objects.filter(cluster=_cluster_or_404(request, cluster), name=name)
    named = found.select_related("cluster").first()
    if named is None:
        raise Http404(f"no such {model._meta.model_name}")
    return named


def _target_or_404(request: HttpRequest, model, cluster: str, name: str, *, kind: str):
    """The run or node a command form names; a post naming one in a cluster the user holds
    no role in is answered 404 and audited (denied, in that cluster's log)."""
    try:
        return _named_or_404(model, request, cluster, name)
    except Http404:
        if request.method == "POST":
            hidden = Cluster.objects.filter(name=cluster).exclude(
                pk__in=clusters_visible(user=request.user)
            )
            label = model._meta.model_name
            attempt_hidden_record(
                user=request.user,
                action=f"command.{kind}",
                target=f"{label}:{name}",
                clusters=hidden,
                request=request,
            )
        raise


@login_required
@require_http_methods(["GET", "POST"])
def run_command(request: HttpRequest, cluster: str, run: str, kind: str) -> HttpResponse:
    """GET: the form alone; POST: issue `kind` (checkpoint, stop, resume) on the run."""
    if kind not in RUN_KINDS:
        raise Http404("no such command")
    found = _target_or_404(request, Run, cluster, run, kind=kind)
    back = reverse("run-detail", kwargs={"cluster": cluster, "run": run})
    return _command_form(request, kind=kind, run=found, back=back)


@login_required
@require_http_methods(["GET", "POST"])
def node_command(request: HttpRequest, cluster: str, node: str, kind: str) -> HttpResponse:
    """GET: the form alone; POST: issue `kind` (cordon, uncordon, drain) on the node."""
    if kind not in NODE_KINDS:
        raise Http404("no such command")
    found = _target_or_404(request, Node, cluster, node, kind=kind)
    back = reverse("node-detail", kwargs={"cluster": cluster, "node": node})
    return _command_form(request, kind=kind, node=found, back=back)


def _command_form(
    request: HttpRequest, *, kind: str, back: str, run: Run | None = None, node: Node | None = None
) -> HttpResponse:
    target = run or node
    assert target is not None
    may = user_may(user=request.user, cluster=target.cluster, action="operate")
    if request.method == "GET":
        if not may:
            return HttpResponseForbidden("you may not operate on this cluster")
        form = CommandForm(kind=kind, target_name=target.name)
        return _form_page(request, form, target, back)
    form = CommandForm(request.POST, kind=kind, target_name=target.name)
    valid = form.is_valid()
    if not valid and may:
        [(field, errors), *_] = form.errors.items()
        services.command_invalid_record(
            user=request.user,
            kind=kind,
            loc=field,
            msg=str(errors[0]),
            cluster=target.cluster,
            target=f"{'run' if run else 'node'}:{target.name}",
            reason=request.POST.get("reason", "")[:2000],
            request=request,
        )
        return _form_page(request, form, target, back, status=400)
    try:
        # a user without the role is refused by the service, which records the attempt
        command, created = services.command_issue(
            user=request.user,
            cluster=target.cluster,
            kind=kind,
            run=run,
            node=node,
            args=form.command_args if valid else {},
            reason=form.cleaned_data.get("reason", "") if valid else "",
            idempotency_key=form.idempotency_key if valid else f"denied:{uuid.uuid4()}",
            request=request,
        )
    except services.CommandDenied as denied:
        return HttpResponseForbidden(str(denied))
    except services.CommandInvalid as invalid:
        form.add_error(None, invalid.msg)
        return _form_page(request, form, target, back, status=400)
    except services.IdempotencyMismatch as mismatch:  # a form's token posted to another kind
        form.add_error(None, str(mismatch))
        return _form_page(request, form, target, back, status=422)
    except services.NodeBusy as busy:
        form.add_error(None, str(busy))
        return _form_page(request, form, target, back, status=409)
    _tell(request, command, created)
    return redirect(f"{back}#commands")


def _tell(request: HttpRequest, command: Command, created: bool) -> None:
    target = command.run.name if command.run else command.node.name if command.node else ""
    text = f"{LABELS[command.kind]} {target}: command {command.pk} is {command.state}."
    if created:
        messages.success(request, text)
    else:
        messages.info(request, f"Already issued by this form (sent twice). {text}")


def _form_page(
    request: HttpRequest, form: CommandForm, target: Run | Node, back: str, status: int = 200
) -> HttpResponse:
    context = {
        "cluster": target.cluster,
        "target": target,
        "target_kind": "run" if isinstance(target, Run) else "node",
        "form": form,
        "kind": form.kind,
        "label": LABELS[form.kind],
        "action": request.path,
        "back": back,
    }
    return render(request, "commands/form_page.html", context, status=status)


@login_required
@require_GET
def run_commands_json(request: HttpRequest, cluster: str, run: str) -> JsonResponse:
    """The run page's list as rows, and the run's header (static/js/commands.js reloads it
    on each snapshot, and when a command's row shows the run in another state)."""
    found = _run_or_404(request, cluster, run)
    rows = commands_rows(cluster=found.cluster, run=found)
    return JsonResponse({"commands": rows, "run": run_header(found)})


@login_required
@require_GET
def node_commands_json(request: HttpRequest, cluster: str, node: str) -> JsonResponse:
    found = _node_or_404(request, cluster, node)
    return JsonResponse({"commands": commands_rows(cluster=found.cluster, node=found)})
