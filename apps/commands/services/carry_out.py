"""Carrying out node commands (`commands.node_carry_out`): the scheduler hook, the node's
new state and the command's end, one node at a time under its carry-out lock (see
node_commands). A drain is started here (reactions.drain_start), so this module sits above
the reactions, which issue the drain's checkpoints and stops."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection, transaction

from apps.audit.models import AuditEntry
from apps.clusters.choices import NodeState
from apps.clusters.models import Node
from apps.commands.choices import CARRIED_OUT_KINDS, CommandKind, CommandState
from apps.commands.models import Command
from apps.commands.services.core import CommandConflict, command_transition
from apps.commands.services.node_commands import (
    CARRY_OUT_BATCH,
    CARRY_OUT_LOCK,
    node_command_enqueue,
)
from apps.commands.services.nodes import HookFailed, node_cordon, node_uncordon
from apps.commands.services.reactions import drain_start


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
        node_command_enqueue(str(late))
    return Command.objects.filter(pk=command_id).first()


def _due(node_id: int):
    return Command.objects.filter(
        node_id=node_id,
        kind__in=CARRIED_OUT_KINDS,
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
        elif command.kind == CommandKind.MAINTENANCE:
            state = NodeState.MAINTENANCE
            hook = node_cordon(node=node, reason=command.reason, state=state, **actor)
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
