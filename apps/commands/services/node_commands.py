"""Node commands (cordon, uncordon, drain): admitted one node at a time when issued, carried
out later in a Celery task (`commands.node_carry_out`), one node at a time, in the order
they were issued.

Two locks, so that issuing never waits on a hook:
- admission (command_issue) holds a transaction-scoped advisory lock on the node while it
  checks for a drain and creates the command: a cordon or uncordon during a live drain is
  refused (NodeBusy, `409`), a second drain gets the first;
- carrying out holds another advisory lock on the node around the scheduler hook and the
  node's new state: two commands of one node never interleave hook and state, so the
  hook's last call is the node's state. (Not the row lock: see _carry_out_lock.)
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.audit.models import AuditEntry
from apps.clusters.choices import NodeState
from apps.clusters.models import Node
from apps.clusters.services import node_mark_down
from apps.commands.choices import LIVE_STATES, CommandKind, CommandState
from apps.commands.models import Command
from apps.commands.services.core import CommandConflict, command_transition
from apps.commands.services.nodes import HookFailed, node_cordon, node_uncordon
from apps.core.tasks import task_enqueue

logger = logging.getLogger(__name__)

NODE_CARRY_OUT_TASK = "commands.node_carry_out"
# The advisory locks' first keys (the second is the node's id): the admission of a node's
# commands, and their carrying out (hook and state).
ADMISSION_LOCK = 0x0B0A
CARRY_OUT_LOCK = 0x0B0B
# Commands one task carries out at most (then it hands the node on to a task of its own).
CARRY_OUT_BATCH = 20


class NodeBusy(Exception):
    """The node is draining: a cordon or uncordon now would overwrite that (409)."""

    def __init__(self, node: Node, drain: Command | None) -> None:
        named = f" (drain {drain.pk})" if drain is not None else ""
        super().__init__(f"node {node.name} is draining{named}: wait for the drain to end")
        self.node, self.drain = node, drain


def node_live_drain(*, node_id: int) -> Command | None:
    """The node's drain that is not over, if any (the oldest, should there be two)."""
    live = Command.objects.filter(node_id=node_id, kind=CommandKind.DRAIN, state__in=LIVE_STATES)
    return live.order_by("issued_at").first()


def node_admit(*, node: Node, kind: str, idempotency_key: str, scope: str) -> Command | None:
    """Inside the issuing transaction, before the command is created: lock the node's
    admission until commit, then return the live drain a new drain is folded into (None:
    create the command). Raises NodeBusy for a cordon or uncordon while the node drains.
    A key that already names a live command of this caller (`scope`, as command_create
    scopes keys) passes: the request is a repeat, and command_create answers it (the
    command it made, or 422 for another request under that key)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [ADMISSION_LOCK, node.pk])
    repeat = Command.objects.filter(
        cluster_id=node.cluster_id,
        idempotency_scope=scope,
        idempotency_key=idempotency_key,
        idempotency_live=True,
    )
    if repeat.exists():
        return None
    drain = node_live_drain(node_id=node.pk)
    if kind == CommandKind.DRAIN:
        return drain
    draining = Node.objects.filter(pk=node.pk, state=NodeState.DRAINING).exists()
    if drain is not None or draining:
        raise NodeBusy(node, drain)
    return None


def node_command_enqueue_on_commit(*, command: Command) -> None:
    """After the issuing transaction commits, hand the command to the task. A lost message
    (broker down, a worker killed) leaves the command issued: the sweep sends it again."""
    command_id = str(command.pk)
    transaction.on_commit(lambda: _enqueue(command_id), robust=True)


def _enqueue(command_id: str) -> None:
    try:
        task_enqueue(NODE_CARRY_OUT_TASK, command_id)
    except Exception:  # the broker's errors are many; the sweep covers every one
        logger.warning("node command %s not enqueued; the sweep will", command_id)


def node_commands_resend() -> int:
    """The sweep's part: node commands still issued COMMANDS_NODE_RETRY_AFTER_S after they
    were issued (their message was lost, or the worker died before it committed) are sent
    again (a task for a node whose commands are being carried out returns at once)."""
    cutoff = timezone.now() - timedelta(seconds=settings.COMMANDS_NODE_RETRY_AFTER_S)
    late = Command.objects.filter(
        kind__in=[CommandKind.CORDON, CommandKind.UNCORDON, CommandKind.DRAIN],
        state=CommandState.ISSUED,
        issued_at__lte=cutoff,
    ).values_list("pk", flat=True)
    sent = 0
    for pk in late[:100]:
        _enqueue(str(pk))
        sent += 1
    return sent


def node_command_carry_out(*, command_id: uuid.UUID | str) -> Command | None:
    """Carry out the node's commands still issued, oldest first, each in a transaction of
    its own under the node's carry-out lock: the scheduler hook, then the node's state,
    then the command's end (succeeded or failed with the hook's result; a drain becomes
    accepted). A task that finds the lock taken returns at once (never holding a worker
    while a hook runs): the holder takes its command, or hands it on after it let go.
    Running twice changes nothing. Returns the command as it is after."""
    node_id = Command.objects.filter(pk=command_id).values_list("node_id", flat=True).first()
    if node_id is None:
        return None
    for _ in range(CARRY_OUT_BATCH):
        with transaction.atomic():
            if not _carry_out_lock(node_id=node_id):
                return Command.objects.filter(pk=command_id).first()  # the holder's turn
            command = _due(node_id).select_related("cluster", "issued_by").first()
            node = Node.objects.select_related("cluster").filter(pk=node_id).first()
            if command is None or node is None:
                break
            _carry_out(command=command, node=node)
    # one issued while the lock was held, whose task found it taken, is handed on now
    late = _due(node_id).values_list("pk", flat=True).first()
    if late is not None:
        _enqueue(str(late))
    return Command.objects.filter(pk=command_id).first()


def _due(node_id: int):
    return Command.objects.filter(
        node_id=node_id,
        kind__in=[CommandKind.CORDON, CommandKind.UNCORDON, CommandKind.DRAIN],
        state=CommandState.ISSUED,
    ).order_by("issued_at", "id")


def _carry_out_lock(*, node_id: int) -> bool:
    """Take the node's carry-out lock until the transaction ends, if it is free. An advisory
    lock, not the row's: a row lock held through a hook would stall ingest, which updates
    the node's row (last_seen) and inserts rows that reference it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [CARRY_OUT_LOCK, node_id])
        return bool(cursor.fetchone()[0])


def _carry_out(*, command: Command, node: Node) -> Command:
    from apps.commands.services.reactions import drain_start

    actor = _actor(command)
    if command.kind == CommandKind.DRAIN:
        return drain_start(command=command, node=node, actor=actor)
    if node.state == NodeState.DRAINING:
        # issued before the drain was, carried out after: the drain stands
        refused = {"refused": f"node {node.name} is draining"}
        return _end(command, CommandState.FAILED, refused)
    try:
        if command.kind == CommandKind.CORDON:
            hook = node_cordon(node=node, reason=command.reason, **actor)
        else:
            hook = node_uncordon(node=node, reason=command.reason, **actor)
    except HookFailed as failed:
        return _end(command, CommandState.FAILED, {"hook": failed.result.to_dict()})
    return _end(command, CommandState.SUCCEEDED, {"hook": hook.to_dict() if hook else None})


def _end(command: Command, state: str, result: dict[str, Any]) -> Command:
    try:
        moved = command_transition(
            command_id=command.pk, to_state=state, detail=result, result=result
        )
    except CommandConflict as conflict:  # expired while its hook ran: the expiry stands
        return conflict.command
    return moved[0]


def _actor(command: Command) -> dict[str, Any]:
    """Who issued the command, as its issue's audit entry recorded it: the node's own audit
    entry (node.cordon, …) names the same actor, client address and request id."""
    issued = (
        AuditEntry.objects.filter(
            action=f"command.{command.kind}",
            outcome="allowed",
            cluster_id=command.cluster_id,
            detail__command=str(command.pk),
            detail__created=True,
        )
        .values("actor_kind", "actor_name", "client_ip", "request_id")
        .first()
    )
    if issued is None:  # created without its audit entry (by hand): the system acted
        return {"actor_user": command.issued_by, "actor_kind": "policy", "request": None}
    return {
        "actor_user": command.issued_by,
        "actor_kind": issued["actor_kind"],
        "actor_name": issued["actor_name"],
        "request": _IssuedRequest(issued["client_ip"], issued["request_id"]),
    }


class _IssuedRequest:
    """The issuing request as its audit entry recorded it, for audit_record (which reads the
    peer's address and the request id): the task that carries the command out has none."""

    def __init__(self, client_ip: str | None, request_id: str) -> None:
        self.META = {"REMOTE_ADDR": client_ip or ""}
        self.audit_request_id = request_id


def on_alert_raised(sender: Any, *, alert: dict[str, Any], **kwargs: Any) -> None:
    """apps.core.signals.alert_raised receiver: a node whose heartbeat alert opened is down."""
    if alert.get("kind") == "heartbeat" and alert.get("node_id") is not None:
        node_mark_down(node_id=alert["node_id"])
