"""The live feed: workers mark nodes dirty after commit; the publisher coalesces and sends.

A synchronous group_send costs 2.5–3.7 ms here, more than storing a whole batch, so the
worker only adds the node to a Redis set (one SADD); `live_publisher` (async) pops the set,
reads the nodes' latest health and sends one numbered delta per cluster, at most about once
a second per node.

And the sockets' ends: when a login ends (logout, its session deleted) or a user's role on a
cluster is removed, a `live.close` message goes to the session's or the user's group on
commit, and the consumers it concerns close at once (apps.live.consumers); the consumers'
periodic check stays as the net for a message lost with Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis
import redis.asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from apps.core.redis import redis_client
from apps.live import send
from apps.live.groups import (
    cluster_group,
    cluster_seq_key,
    dirty_nodes_key,
    session_group,
    user_group,
)
from apps.live.selectors import node_health_list

logger = logging.getLogger(__name__)


def live_mark_dirty(*, nodes: set[tuple[int, int]]) -> None:
    """Queue these (cluster id, node id) for the next live delta (on commit; best effort)."""
    if not nodes:
        return
    members = [f"{cluster_id}:{node_id}" for cluster_id, node_id in nodes]
    try:
        redis_client().sadd(dirty_nodes_key(), *members)
    except redis.RedisError:
        # The data is stored; the browser catches up from its next snapshot.
        logger.warning("live feed unavailable; %d nodes not announced", len(members))


async def live_publish_forever(
    *, interval: float, node_interval: float, stop: asyncio.Event | None = None
) -> None:
    """Send coalesced deltas until `stop` is set: pop dirty nodes every `interval` seconds,
    hold back a node sent less than `node_interval` seconds ago."""
    layer = get_channel_layer()
    client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1)
    last_sent: dict[str, float] = {}
    pending: set[str] = set()
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            popped = await client.spop(dirty_nodes_key(), 100_000)
            pending.update(member.decode() for member in popped or ())
            now = time.monotonic()
            due = {m for m in pending if now - last_sent.get(m, -1e9) >= node_interval}
            if due:
                # sent, then forgotten: a send that fails (Redis going or just back) keeps
                # them for the next round; deltas carry whole states, so a resend is harmless
                await _publish(layer, client, due)
                pending -= due
                last_sent.update(dict.fromkeys(due, now))
        except (redis.RedisError, OSError, DatabaseError) as error:
            logger.warning("live publisher: %s; retrying", error)
            await asyncio.sleep(1)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
    await client.aclose()


async def _publish(layer, client, members: set[str]) -> None:
    node_ids = [int(member.split(":")[1]) for member in members]
    nodes = await sync_to_async(node_health_list, thread_sensitive=False)(node_ids=node_ids)
    by_cluster: dict[int, list[dict]] = {}
    for node in nodes:
        by_cluster.setdefault(node["cluster_id"], []).append(node)
    for cluster_id, cluster_nodes in by_cluster.items():
        seq = await client.incr(cluster_seq_key(cluster_id))
        await layer.group_send(
            cluster_group(cluster_id), {"type": "live.delta", "seq": seq, "nodes": cluster_nodes}
        )


def live_close_session(*, session_key: str) -> None:
    """On commit: close every live socket of this login (consumers answer 4401)."""
    group = session_group(session_key)
    transaction.on_commit(lambda: _send_close(group, {"type": "live.close", "ended": "session"}))


def live_close_cluster(*, user_id: int, cluster_id: int) -> None:
    """On commit: close the user's live sockets on this cluster, those that no longer see it
    (consumers re-check and answer 4403; a superuser's stay open)."""
    message = {"type": "live.close", "ended": "role", "cluster_id": cluster_id}
    transaction.on_commit(lambda: _send_close(user_group(user_id), message))


def _send_close(group: str, message: dict[str, Any]) -> None:
    try:
        send.group_send(group, message)
    except (redis.RedisError, OSError) as error:
        # the logout or removal stands; the sockets' periodic check closes them instead
        logger.warning("live close to %s not sent: %s", group, error)


# Receivers (connected in LiveConfig.ready): hand off, nothing more.
def on_user_logged_out(sender: Any, *, request: Any, **kwargs: Any) -> None:
    """django.contrib.auth's user_logged_out: sent before the session is flushed."""
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        live_close_session(session_key=session_key)


def on_session_deleted(sender: Any, *, instance: Any, **kwargs: Any) -> None:
    """post_delete of a stored session (the admin, a shell, a logout's flush). An expired one
    is skipped: `clearsessions` deletes them by the thousand, and their sockets' periodic
    check has closed them already or will."""
    if instance.expire_date > timezone.now():
        live_close_session(session_key=instance.session_key)


def on_role_revoked(sender: Any, *, user_id: int, cluster_id: int, **kwargs: Any) -> None:
    """apps.core.signals.role_revoked."""
    live_close_cluster(user_id=user_id, cluster_id=cluster_id)
