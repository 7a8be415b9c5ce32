"""Websocket /ws/clusters/<name>/: a snapshot of every node on connect, then coalesced deltas.

Protocol (server → client): {"type": "snapshot", "seq": n, "nodes": [...]} then
{"type": "delta", "seq": n+1, "nodes": [...], "alerts": [...], "commands": [...]}, ...: at
most one message per LIVE_SOCKET_FLUSH_S (apps.live.coalesce), each delta the newest state
of every node that changed since the socket's last message (alerts and commands present when
any changed). A flush holding one alert or one command alone sends it as it always was,
unnumbered: {"type": "alert", "alert": {...}}, {"type": "command", "command": {...}}. States
and rows are whole, so applying one twice is harmless. The socket numbers its own messages
one after another and sends a new snapshot itself when the cluster's group lost a delta on
the way; a client that sees a gap in `seq` anyway sends {"type": "resync"} and gets a
snapshot at the next flush. Consumers never write to the database.

The socket lives no longer than its login and its access. It closes at once with 4401 when
its session ends (logout, the session deleted), and with 4403 when the user's role on the
cluster is removed and nothing else (superuser) still shows it: a `live.close` message to the
socket's session or user group (apps.live.services, on commit). As the net for a message lost
with Redis, and for what sends none (expiry, deactivation, a role deleted behind the service's
back), the login and access are re-checked at most every LIVE_SESSION_CHECK_S before a
message goes out and on a timer while idle.
"""

import asyncio
import contextlib
import logging
import time

import orjson
import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError

from apps.access.selectors import clusters_visible
from apps.core.counters import gauge_add
from apps.core.redis import redis_client
from apps.live.coalesce import SocketBuffer
from apps.live.groups import cluster_group, cluster_seq_key, session_group, user_group
from apps.live.selectors import node_health_list, session_user

# opsboard_websocket_clients (apps.metrics): accepted sockets, summed over the ASGI processes
WS_CLIENTS = "opsboard_websocket_clients"
CLOSE_UNAUTHENTICATED = 4401  # no login, or it ended: logout, expiry, deactivation, password
CLOSE_FORBIDDEN = 4403  # the user's role that showed this cluster was removed
CLOSE_NOT_FOUND = 4404  # no such cluster, or one the user holds no role in

logger = logging.getLogger(__name__)


class ClusterLiveConsumer(AsyncJsonWebsocketConsumer):
    closed = False
    watcher: asyncio.Task | None = None
    flusher: asyncio.Task | None = None
    cluster_id: int | None = None
    counted = False
    sent_at = 0.0  # monotonic time of the last message sent: the next waits LIVE_SOCKET_FLUSH_S

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user_id = user.pk
        self.session_key = getattr(self.scope.get("session"), "session_key", None)
        # Join the groups that carry this login's end first, then check the login: a logout
        # or role removal committed meanwhile is either seen by the check or delivered after.
        self.joined = [user_group(user.pk)]
        if self.session_key:
            self.joined.append(session_group(self.session_key))
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        code, cluster_id = await database_sync_to_async(_admission)(
            self.session_key, self.user_id, self.scope["url_route"]["kwargs"]["cluster_name"]
        )
        if cluster_id is None:
            await self.end(code)
            return
        self.cluster_id = cluster_id
        self.checked_at = time.monotonic()
        # Join first, then read: a delta sent meanwhile is either in the snapshot or after it.
        self.joined.append(cluster_group(cluster_id))
        await self.channel_layer.group_add(self.joined[-1], self.channel_name)
        await self.accept()
        self.counted = True
        gauge_add(WS_CLIENTS, 1)
        self.buffer = SocketBuffer()
        self.ready = asyncio.Event()  # set when the buffer holds something to send
        self.watcher = asyncio.create_task(self.watch_session())
        if await self.session_valid():
            await self.send_snapshot()
        self.flusher = asyncio.create_task(self.flush_forever())

    async def disconnect(self, code: int) -> None:
        self.closed = True
        if self.counted:
            self.counted = False
            gauge_add(WS_CLIENTS, -1)
        for task in (self.watcher, self.flusher):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await self.leave_groups()

    async def end(self, code: int) -> None:
        """Close with `code` (before or after accepting) and stop listening at once. Once:
        the idle timer and a message handler may both find the login ended."""
        if self.closed:
            return
        self.closed = True
        await self.close(code=code)
        await self.leave_groups()

    async def leave_groups(self) -> None:
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = []

    @classmethod
    async def encode_json(cls, content) -> str:
        # a fleet's snapshot or delta is megabytes of node states: orjson writes them about
        # ten times faster than json, and NaN as null (JSON.parse refuses json's NaN)
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS).decode()

    async def receive_json(self, content, **kwargs) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            self.hold(self.buffer.resync)

    # Group events are only taken into the buffer; flush_forever sends.
    def hold(self, take, *args) -> None:
        if self.cluster_id is not None and not self.closed:
            take(*args)
            self.ready.set()

    async def live_delta(self, event) -> None:
        """A numbered delta of whole node states (apps.live.services, the publisher)."""
        self.hold(self.buffer.delta, event["seq"], event["nodes"])

    async def alert_changed(self, event) -> None:
        """An alert opened, escalated, was acknowledged or resolved (apps.alerts.services)."""
        self.hold(self.buffer.alert, event["alert"])

    async def command_changed(self, event) -> None:
        """A command was issued or changed state (apps.commands.services.broadcast)."""
        self.hold(self.buffer.command, event["command"])

    async def flush_forever(self) -> None:
        """Send what the buffer holds, one message at a time and each at least
        LIVE_SOCKET_FLUSH_S after the one before: at most 1 / LIVE_SOCKET_FLUSH_S messages a
        second (4 by default), however many nodes, alerts or commands change. The first
        change after a quiet spell goes out at once."""
        with contextlib.suppress(asyncio.CancelledError):
            while not self.closed:
                await self.ready.wait()
                due = self.sent_at + settings.LIVE_SOCKET_FLUSH_S - time.monotonic()
                if due > 0:
                    await asyncio.sleep(due)
                self.ready.clear()
                try:
                    await self.flush()
                except (DatabaseError, redis.RedisError, OSError) as error:
                    # the session check or the snapshot's read found no answer: what is
                    # pending (the snapshot owed too) stays, and goes at the next flush
                    logger.warning("live socket: flush failed: %s", error)
                    self.sent_at = time.monotonic()
                if self.buffer.pending:  # what a snapshot left (alerts, commands): next flush
                    self.ready.set()

    async def flush(self) -> None:
        if not await self.session_valid():
            return
        if self.buffer.snapshot_due:
            await self.send_snapshot()
            return
        message = self.buffer.take()
        if message is not None:
            await self.send_json(message)
            self.sent_at = time.monotonic()

    async def send_snapshot(self) -> None:
        seq, nodes = await database_sync_to_async(_snapshot)(self.cluster_id)
        await self.send_json(self.buffer.snapshot(seq, nodes))
        self.sent_at = time.monotonic()

    async def live_close(self, event) -> None:
        """A login ended or a role was removed (apps.live.services): {"ended": "session"}
        closes with 4401; {"ended": "role", "cluster_id": n} closes a socket on that cluster
        with 4403 unless the user still sees it (a superuser does), re-checked here."""
        if self.closed:
            return
        if event.get("ended") == "session":
            await self.end(CLOSE_UNAUTHENTICATED)
        elif event.get("cluster_id") == self.cluster_id:
            await self.session_valid(force=True)

    async def session_valid(self, *, force: bool = False) -> bool:
        """False (and the socket closed: 4401, 4403) once the login behind it has ended or
        no longer shows the cluster; looked up at most every LIVE_SESSION_CHECK_S, so a busy
        feed costs no query per message."""
        if self.closed:
            return False
        if force or time.monotonic() - self.checked_at >= settings.LIVE_SESSION_CHECK_S:
            self.checked_at = time.monotonic()
            code = await database_sync_to_async(_access_lost)(
                self.session_key, self.user_id, self.cluster_id
            )
            if code is not None:
                await self.end(code)
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


def _admission(session_key: str | None, user_id: int, name: str) -> tuple[int, int | None]:
    """(close code, None) or (0, the id of the cluster `name` this login may watch). A cluster
    the user holds no role in is "not found", as on the pages."""
    user = session_user(session_key=session_key)
    if user is None or user.pk != user_id:
        return CLOSE_UNAUTHENTICATED, None
    cluster_id = clusters_visible(user=user).filter(name=name).values_list("pk", flat=True).first()
    return (CLOSE_NOT_FOUND, None) if cluster_id is None else (0, cluster_id)


def _access_lost(session_key: str | None, user_id: int, cluster_id: int | None) -> int | None:
    """The close code once this login has ended or no longer shows the cluster; else None."""
    user = session_user(session_key=session_key)
    if user is None or user.pk != user_id:
        return CLOSE_UNAUTHENTICATED
    if not clusters_visible(user=user).filter(pk=cluster_id).exists():
        return CLOSE_FORBIDDEN
    return None


def _snapshot(cluster_id: int) -> tuple[int, list]:
    seq = int(redis_client().get(cluster_seq_key(cluster_id)) or 0)
    return seq, node_health_list(cluster_id=cluster_id)
