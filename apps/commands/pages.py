"""What the run and node pages show of commands: the list, and the forms for those allowed
to press them (apps.dashboard.views adds this to its context; apps.commands.views takes the
forms' posts)."""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, Subquery

from apps.access.selectors import user_may
from apps.clusters.choices import NodeState
from apps.clusters.models import Cluster, Node
from apps.commands.choices import CommandKind, CommandState
from apps.commands.forms import CommandForm, resume_initial
from apps.commands.models import Command
from apps.commands.plan import run_plan
from apps.commands.rows import command_row
from apps.commands.selectors import command_list
from apps.runs.models import Run

PAGE_COMMANDS = 50  # newest first; the API lists more


def commands_rows(*, cluster: Cluster, run: Run | None = None, node: Node | None = None) -> list:
    """The newest PAGE_COMMANDS commands of the run (or of the node)."""
    found = command_list(
        clusters=Cluster.objects.filter(pk=cluster.pk),
        run=run.name if run else None,
        node=node.name if node else None,
        limit=PAGE_COMMANDS,
    )
    return [command_row(command) for command in found]


def run_commands_context(*, user: Any, cluster: Cluster, run: Run) -> dict[str, Any]:
    """The run page's commands, and its forms (checkpoint, stop, resume pre-filled from the
    plan) when the user may operate on the cluster."""
    context: dict[str, Any] = {
        "command_rows": commands_rows(cluster=cluster, run=run),
        "may_operate": user_may(user=user, cluster=cluster, action="operate"),
    }
    if context["may_operate"]:
        name = run.name
        context["command_forms"] = {
            "checkpoint": CommandForm(kind=CommandKind.CHECKPOINT, target_name=name),
            "stop": CommandForm(kind=CommandKind.STOP, target_name=name),
            "resume": CommandForm(
                kind=CommandKind.RESUME,
                target_name=name,
                initial=resume_initial(run_plan(run=run)),
            ),
        }
    return context


def node_commands_context(*, user: Any, cluster: Cluster, node: Node) -> dict[str, Any]:
    """The node page's commands, and its forms: cordon or uncordon (whichever applies) and
    drain, when the user may operate on the cluster."""
    context: dict[str, Any] = {
        "command_rows": commands_rows(cluster=cluster, node=node),
        "may_operate": user_may(user=user, cluster=cluster, action="operate"),
    }
    if context["may_operate"]:
        name = node.name
        forms = {}
        state = node_state_expected(node=node)
        if state == NodeState.MAINTENANCE:
            forms["return"] = CommandForm(kind=CommandKind.UNCORDON, target_name=name)
            forms["return"].fields["reason"].required = True  # a note of what was done
        elif state == NodeState.CORDONED:
            forms["uncordon"] = CommandForm(kind=CommandKind.UNCORDON, target_name=name)
        elif state != NodeState.DRAINING:
            forms["cordon"] = CommandForm(kind=CommandKind.CORDON, target_name=name)
        if state not in (NodeState.DRAINING, NodeState.MAINTENANCE):
            forms["drain"] = CommandForm(kind=CommandKind.DRAIN, target_name=name)
            forms["maintenance"] = CommandForm(kind=CommandKind.MAINTENANCE, target_name=name)
        context["command_forms"] = forms
    return context


# The state a node command leaves its node in, once carried out.
_STATE_AFTER = {
    CommandKind.CORDON: NodeState.CORDONED,
    CommandKind.UNCORDON: NodeState.ACTIVE,
    CommandKind.DRAIN: NodeState.DRAINING,
    CommandKind.MAINTENANCE: NodeState.MAINTENANCE,
}


def node_state_expected(*, node: Node) -> str:
    """The node's state once its newest node command still `issued` is carried out (its
    state when none is): the page that just posted a cordon offers the uncordon, not a
    second cordon, while the worker runs the hook. One query, reading the node's state
    again with its commands: the node loaded earlier may predate the carry-out that took its
    command out of `issued` (the two change in one transaction)."""
    pending = Command.objects.filter(
        node_id=OuterRef("pk"), kind__in=list(_STATE_AFTER), state=CommandState.ISSUED
    ).order_by("-issued_at")
    found = (
        Node.objects.filter(pk=node.pk)
        .annotate(pending=Subquery(pending.values("kind")[:1]))
        .values_list("state", "pending")
        .first()
    )
    if found is None:
        return node.state
    state, kind = found
    return _STATE_AFTER[kind] if kind else state
