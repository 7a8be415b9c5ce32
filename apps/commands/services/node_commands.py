"""Node commands (cordon, uncordon, drain): admitted one node at a time when issued, carried
out later in a Celery task (`commands.node_carry_out`), one node at a time, in the order
they were issued.

Two locks, so that issuing never waits on a hook:
- admission (command_issue) holds a transaction-scoped advisory lock on the node while it
  checks for a drain and creates the command: a cordon or uncordon during a live drain is
  refused (NodeBusy, `409`), a second drain gets the first;
- carrying out holds another advisory lock on the node around the scheduler hook and the
  node's new state: two commands of one node never interleave hook and state, so the
  hook's last call is the node's state. (Not the row lock: see carry_out._carry_out_lock.)
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.clusters.choices import NodeState
from apps.clusters.models import Node
from apps.clusters.services import node_mark_down
from apps.commands.choices import CARRIED_OUT_KINDS, LIVE_STATES, CommandKind, CommandState
from apps.commands.models import Command
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
    transaction.on_commit(lambda: node_command_enqueue(command_id), robust=True)


def node_command_enqueue(command_id: str) -> None:
    """Send the node's command to the carry-out task now; a lost message is the sweep's."""
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
        kind__in=CARRIED_OUT_KINDS,
        state=CommandState.ISSUED,
        issued_at__lte=cutoff,
    ).values_list("pk", flat=True)
    sent = 0
    for pk in late[:100]:
        node_command_enqueue(str(pk))
        sent += 1
    return sent


def on_alert_raised(sender: Any, *, alert: dict[str, Any], **kwargs: Any) -> None:
    """apps.core.signals.alert_raised receiver: a node whose heartbeat alert opened is down."""
    if alert.get("kind") == "heartbeat" and alert.get("node_id") is not None:
        node_mark_down(node_id=alert["node_id"])
