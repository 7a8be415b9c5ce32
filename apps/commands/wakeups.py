"""Waking held long-polls: when a command becomes deliverable, a message on the Redis channel
of its cluster and node wakes the polls waiting for that node (docs/actions.md, Delivery).

This module builds the names (`wake_channel`, and `wake_pattern`, which a server process
subscribes to once) and publishes. The message is the command's kind, so a poll that asked
for other kinds (`kinds=`) is not woken. A lost message only delays: the waiting side also
looks in the database every COMMANDS_RECHECK_S (apps.commands.longpoll).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import redis
from django.conf import settings
from django.db import transaction

from apps.commands.choices import DELIVERED_KINDS
from apps.commands.models import Command
from apps.commands.selectors import run_serving_node_names
from apps.core.redis import redis_client

log = logging.getLogger(__name__)

WAKE = "commands:wake"
GLOB_SPECIAL = re.compile(r"[*?\[\]\\]")


def wake_channel(cluster_id: int, node_name: str) -> str:
    return f"{settings.REDIS_PREFIX}:{WAKE}:{cluster_id}:{node_name}"


def wake_pattern() -> str:
    """Every wake channel of this deployment (the prefix's glob characters escaped)."""
    prefix = GLOB_SPECIAL.sub(r"\\\g<0>", settings.REDIS_PREFIX)
    return f"{prefix}:{WAKE}:*"


def commands_wake_on_commit(*, command: Command) -> None:
    """After the transaction commits, wake the polls of the nodes that may receive `command`:
    its node, or the nodes serving its run when it names none."""
    if command.kind not in DELIVERED_KINDS:
        return
    if command.node_id is not None:
        names = [command.node.name]
    elif command.run_id is not None:
        names = run_serving_node_names(run_id=command.run_id)
    else:
        return
    cluster_id, kind = command.cluster_id, str(command.kind)
    transaction.on_commit(lambda: wake_publish(cluster_id=cluster_id, names=names, kind=kind))


def wake_publish(*, cluster_id: int, names: Iterable[str], kind: str) -> None:
    """Publish now (callers inside a transaction use commands_wake_on_commit). A Redis
    failure is logged, not raised: the polls' database re-check delivers the command."""
    try:
        pipe = redis_client().pipeline(transaction=False)
        for name in names:
            pipe.publish(wake_channel(cluster_id, name), kind)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        log.warning("could not wake the long-polls of cluster %s: %s", cluster_id, exc)
