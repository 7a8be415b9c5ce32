"""Telling the pages that a command changed: a `command.changed` message to its cluster's
Channels group (apps.live.consumers forwards it as {"type": "command", "command": row}),
and, for a node command, the node marked for the next live delta (its state changed)."""

from __future__ import annotations

import logging
import uuid

import redis
from django.db import transaction

from apps.commands.choices import NODE_KINDS
from apps.commands.rows import command_row
from apps.commands.selectors import command_get
from apps.live.groups import cluster_group
from apps.live.send import group_send
from apps.live.services import live_mark_dirty

logger = logging.getLogger(__name__)


def command_broadcast_on_commit(*, command_id: uuid.UUID | str) -> None:
    """After the caller's transaction commits (at once outside one), send the command's row
    as it is then. Best effort: the command is stored, and a page reads it on reload; robust,
    so that no failure here reaches the caller, whose command is done. One query and one
    group_send on the process's sender loop (apps.live.send) per change."""
    transaction.on_commit(lambda: _broadcast(command_id), robust=True)


def _broadcast(command_id: uuid.UUID | str) -> None:
    command = command_get(command_id=command_id)
    if command is None:  # its cluster was deleted meanwhile
        return
    try:
        group_send(
            cluster_group(command.cluster_id),
            {"type": "command.changed", "command": command_row(command)},
        )
    except (redis.RedisError, OSError):
        logger.warning("live feed unavailable; command %s change not broadcast", command_id)
    if command.node_id is not None and command.kind in NODE_KINDS:
        live_mark_dirty(nodes={(command.cluster_id, command.node_id)})
