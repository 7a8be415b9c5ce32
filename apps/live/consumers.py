"""Websocket /ws/clusters/<name>/: a snapshot of every node on connect, then numbered deltas.

Protocol (server → client): {"type": "snapshot", "seq": n, "nodes": [...]} then
{"type": "delta", "seq": n+1, "nodes": [...]}, ...; a client that sees a gap in `seq` sends
{"type": "resync"} and gets a new snapshot. Deltas carry whole node states, so applying one
twice is harmless. Unnumbered, as they happen: {"type": "alert", "alert": {...}} and
{"type": "command", "command": {...}} (a row of a page's command list, whole: applying one
twice is harmless too). Consumers never write to the database.

The socket lives no longer than its login: the session is re-checked at most every
LIVE_SESSION_CHECK_S before a message goes out and on a timer while idle, and the socket is
closed with 4401 once the user logged out, the session expired, the user was deactivated or
changed password.
"""

import asyncio
import contextlib
import logging
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError

from apps.access.selectors import clusters_visible
from apps.clusters.models import Cluster
from apps.core.redis import redis_client
from apps.live.groups import cluster_group, cluster_seq_key
from apps.live.selectors import node_health_list, session_user_id

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404

logger = logging.getLogger(__name__)


class ClusterLiveConsumer(AsyncJsonWebsocketConsumer):
    closed = False
    watcher: asyncio.Task | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user_id = user.pk
        self.session_key = getattr(self.scope.get("session"), "session_key", None)
        self.checked_at = time.monotonic()
        # a cluster the user holds no role in is "not found", as on the pages
        cluster = await database_sync_to_async(_visible_cluster)(
            user, self.scope["url_route"]["kwargs"]["cluster_name"]
        )
        if cluster is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.cluster_id = cluster.id
        self.group = cluster_group(cluster.id)
        # Join first, then read: a delta sent meanwhile is either in the snapshot or after it.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.watcher = asyncio.create_task(self.watch_session())
        await self.send_snapshot()

    async def disconnect(self, code: int) -> None:
        self.closed = True
        if self.watcher is not None and self.watcher is not asyncio.current_task():
            self.watcher.cancel()
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            await self.send_snapshot()

    async def send_snapshot(self) -> None:
        if not await self.session_valid():
            return
        seq, nodes = await database_sync_to_async(_snapshot)(self.cluster_id)
        await self.send_json({"type": "snapshot", "seq": seq, "nodes": nodes})

    async def live_delta(self, event) -> None:
        if await self.session_valid():
            await self.send_json({"type": "delta", "seq": event["seq"], "nodes": event["nodes"]})

    async def alert_changed(self, event) -> None:
        """An alert opened, escalated, was acknowledged or resolved (apps.alerts.services)."""
        if await self.session_valid():
            await self.send_json({"type": "alert", "alert": event["alert"]})

    async def command_changed(self, event) -> None:
        """A command was issued or changed state (apps.commands.services.broadcast)."""
        if await self.session_valid():
            await self.send_json({"type": "command", "command": event["command"]})

    async def session_valid(self, *, force: bool = False) -> bool:
        """False (and the socket closed with 4401) once the login behind it has ended;
        looked up at most every LIVE_SESSION_CHECK_S, so a busy feed costs no query per
        message."""
        if self.closed:
            return False
        if force or time.monotonic() - self.checked_at >= settings.LIVE_SESSION_CHECK_S:
            self.checked_at = time.monotonic()
            user_id = await database_sync_to_async(session_user_id)(session_key=self.session_key)
            if user_id != self.user_id:
                self.closed = True
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return False
        return True

    async def watch_session(self) -> None:
        """While no message goes out, the login is still re-checked on this timer."""
        with contextlib.suppress(asyncio.CancelledError):
            while not self.closed:
                due = self.checked_at + settings.LIVE_SESSION_CHECK_S - time.monotonic()
                if due > 0:
                    await asyncio.sleep(due)
                    continue
                try:
                    await self.session_valid(force=True)
                except DatabaseError as error:
                    # no answer is not a logout: keep the socket, ask again next time
                    logger.warning("live socket: session check failed: %s", error)


def _visible_cluster(user, name: str) -> Cluster | None:
    return clusters_visible(user=user).filter(name=name).first()


def _snapshot(cluster_id: int) -> tuple[int, list]:
    seq = int(redis_client().get(cluster_seq_key(cluster_id)) or 0)
    return seq, node_health_list(cluster_id=cluster_id)
