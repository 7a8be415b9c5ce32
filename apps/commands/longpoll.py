"""The agents' long-poll, `GET /api/v1/commands?node=NAME&wait=S[&kinds=…]` (docs/actions.md).

Where it is served:
- `LongPollApp`, in front of Django in the ASGI server (opsboard/asgi.py), answers an agent
  token's poll itself. A held poll is a coroutine waiting on an asyncio.Event: one Redis
  pattern subscription per process (`WakeHub`) fans the wake-ups out
  (apps.commands.wakeups), and the database is touched only when the poll starts, when it
  is woken, and by the process's safety net (one query every COMMANDS_RECHECK_S for all its
  polls). Everything else (users' lists, bad tokens) goes on to Django.
- The WSGI view (apps.commands.api) answers a poll with `wait > 0` from a client that says it
  follows redirects (`X-Opsboard-Redirects: follow`, as opsboard_agent does) by
  `longpoll_redirect`: 307 to the same host on the ASGI port (LIVE_WS_PORT), so gunicorn's
  sync workers stay with ingest. Only on request: generic clients (curl -L, requests, httpx)
  drop the Authorization header when the port changes, and an older agent follows nothing.
  Other polls reaching WSGI (those clients; no ASGI port configured, as behind a reverse
  proxy that routes the path to the ASGI server itself, docker/nginx.conf) are served there
  by `poll_sync`, holding that worker for up to `wait` (apps.commands.longpoll_wsgi).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import orjson
import pydantic
import redis
import redis.asyncio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.http.request import split_domain_port, validate_host
from django.utils import timezone

from apps.clusters.models import AgentToken
from apps.clusters.selectors import token_authenticate
from apps.commands import services
from apps.commands.schemas import CommandsQuery
from apps.commands.selectors import command_get, command_json, commands_deliverable_targets
from apps.commands.wakeups import wake_channel, wake_pattern
from apps.core.auth import NODE_NOT_OURS
from apps.core.errors import validation_errors
from apps.core.middleware import NUL, NUL_MESSAGE

log = logging.getLogger(__name__)

COMMANDS_PATH = "/api/v1/commands"
# A client sending `X-Opsboard-Redirects: follow` follows a 307 to the same host keeping
# its Authorization header.
REDIRECTS_HEADER = "X-Opsboard-Redirects"
# Database work of the held polls: a few threads, each keeping its connection open.
DB_THREADS = 4
_db_pool = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="longpoll-db")
RESUBSCRIBE_MAX_S = 5.0
T = TypeVar("T")


def deliver_json(
    *, cluster_id: int, node_name: str, kinds: Collection[str] | None, run: str | None = None
) -> list[dict[str, Any]]:
    """Hand out the node's pending commands (apps.commands.services.commands_deliver) and
    answer them as the API does."""
    handed = services.commands_deliver(
        cluster_id=cluster_id, node_name=node_name, kinds=kinds, run=run
    )
    return [command_json(command_get(command_id=command.pk)) for command in handed]


def kind_wanted(kind: Any, kinds: Collection[str] | None) -> bool:
    """Whether a wake-up message for `kind` concerns a poll asking for `kinds`."""
    text = kind.decode() if isinstance(kind, bytes) else str(kind)
    return kinds is None or text in kinds


# -- ASGI ----------------------------------------------------------------------------------


class _Waiter:
    __slots__ = ("event", "kinds", "gone")

    def __init__(self, kinds: Collection[str] | None) -> None:
        self.event = asyncio.Event()
        self.kinds = kinds
        self.gone = False


class WakeHub:
    """One per event loop: a single Redis pattern subscription to every wake channel, fanned
    out to the polls waiting in this process, and the safety net: every COMMANDS_RECHECK_S
    one query finds the commands deliverable now and wakes their nodes' polls (a lost
    message, a stale delivery due again, a node that began serving a run).

    It also knows what may be pending: the (channel, kind) pairs of the last re-check and of
    every wake-up since it began. While that knowledge is whole (subscribed since before the
    re-check), a new poll for a node it holds nothing for skips its first database look: it
    would miss only what a lost message would, which the next re-check finds. So 1,000 polls
    re-polling at once cost 1,000 token lookups, not 1,000 delivery queries."""

    def __init__(self) -> None:
        self.waiters: dict[str, set[_Waiter]] = {}
        self.listening = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.pending: set[tuple[str, str]] = set()
        self.known = False  # `pending` is whole
        self._subscription = 0  # counts (re)subscriptions
        self._since_recheck: set[tuple[str, str]] | None = None

    def may_have(self, channel: str, kinds: Collection[str] | None) -> bool:
        """Whether a command for this channel (of these kinds) may be deliverable."""
        if not self.known:
            return True
        return any(c == channel and kind_wanted(k, kinds) for c, k in self.pending)

    async def ready(self) -> None:
        """Started, and subscribed unless Redis does not answer within a second."""
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._listen(), name="commands-wake-listen"),
                asyncio.create_task(self._recheck(), name="commands-wake-recheck"),
            ]
        if not self.listening.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.listening.wait(), 1.0)

    @contextlib.contextmanager
    def waiting(self, channel: str, kinds: Collection[str] | None) -> Iterator[_Waiter]:
        waiter = _Waiter(kinds)
        self.waiters.setdefault(channel, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self.waiters.get(channel)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self.waiters[channel]

    def announce(self, channel: str, kind: Any) -> None:
        """A wake-up message: remembered as pending, and the channel's polls woken."""
        text = kind.decode() if isinstance(kind, bytes) else str(kind)
        self.pending.add((channel, text))
        if self._since_recheck is not None:
            self._since_recheck.add((channel, text))
        self.wake(channel, text)

    def wake(self, channel: str, kind: Any = None) -> None:
        for waiter in self.waiters.get(channel, ()):
            if kind is None or kind_wanted(kind, waiter.kinds):
                waiter.event.set()

    def wake_all(self) -> None:
        for channel in list(self.waiters):
            self.wake(channel)

    async def _listen(self) -> None:
        failures = 0
        while True:
            client = redis.asyncio.Redis.from_url(
                settings.REDIS_URL, socket_connect_timeout=2, health_check_interval=30
            )
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(wake_pattern())
                self._subscription += 1
                self.listening.set()
                failures = 0
                self.wake_all()  # what was published while we were away is lost
                async for message in pubsub.listen():
                    if message.get("type") == "pmessage":
                        channel = message["channel"]
                        self.announce(channel.decode() if isinstance(channel, bytes) else channel,
                                      message.get("data"))  # fmt: skip
            except (redis.RedisError, OSError) as exc:
                failures += 1
                self.listening.clear()
                self.known = False
                if failures in (1, 10):
                    log.warning("long-poll wake-ups lost (%s); resubscribing", exc)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                    await client.aclose()
            await asyncio.sleep(min(RESUBSCRIBE_MAX_S, 0.1 * 2**failures))

    async def _recheck(self) -> None:
        while True:
            try:
                await self._recheck_once()
            except Exception as exc:  # the safety net must outlive a bad pass
                self.known = False
                log.warning("long-poll safety re-check failed: %s", exc)
            await asyncio.sleep(settings.COMMANDS_RECHECK_S)

    async def _recheck_once(self) -> None:
        subscription = self._subscription if self.listening.is_set() else -1
        self._since_recheck = set()
        try:
            targets = await _db(_deliverable_targets)
            found = {(wake_channel(c, n), kind) for c, n, kind in targets}
            self.pending = found | self._since_recheck
        finally:
            self._since_recheck = None
        self.known = subscription == self._subscription and self.listening.is_set()
        for channel, kind in found:
            self.wake(channel, kind)


def _deliverable_targets() -> list[tuple[int, str, str]]:
    stale = timezone.now() - timedelta(seconds=settings.COMMANDS_REDELIVER_AFTER_S)
    return commands_deliverable_targets(stale=stale)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WakeHub] = weakref.WeakKeyDictionary()


def wake_hub() -> WakeHub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = WakeHub()
    return hub


async def _db(function: Callable[..., T], **kwargs: Any) -> T:
    """Run database work in the long-poll's threads. Their connections stay open between
    calls (no request cycle closes them); a broken one is closed so the next call
    reconnects."""

    def run() -> T:
        try:
            return function(**kwargs)
        except (OperationalError, InterfaceError):
            connection.close()
            raise

    return await sync_to_async(run, thread_sensitive=False, executor=_db_pool)()


async def poll_async(
    *,
    cluster_id: int,
    node_name: str,
    kinds: Collection[str] | None,
    wait: float,
    receive: Callable | None = None,
    run: str | None = None,
) -> list[dict[str, Any]] | None:
    """Serve a long-poll as a coroutine: the commands handed out, or None when the client
    went away first (ASGI `receive` said so: nothing is handed out to a closed connection)."""
    hub = wake_hub()
    await hub.ready()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    with hub.waiting(wake_channel(cluster_id, node_name), kinds) as waiter:
        watcher = asyncio.create_task(_disconnected(receive, waiter)) if receive else None
        try:
            return await _held(waiter, cluster_id, node_name, kinds, deadline, run)
        finally:
            if watcher is not None:
                watcher.cancel()


async def _held(
    waiter: _Waiter,
    cluster_id: int,
    node_name: str,
    kinds: Collection[str] | None,
    deadline: float,
    run: str | None = None,
) -> list[dict[str, Any]] | None:
    loop = asyncio.get_running_loop()
    hub, channel = wake_hub(), wake_channel(cluster_id, node_name)
    look = hub.may_have(channel, kinds)
    while True:
        waiter.event.clear()
        handed = []
        if look:
            handed = await _db(
                deliver_json, cluster_id=cluster_id, node_name=node_name, kinds=kinds, run=run
            )
        look = True
        remaining = deadline - loop.time()
        if handed or remaining <= 0:
            return handed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.event.wait(), remaining)
        if waiter.gone:
            return None
        if loop.time() >= deadline and not waiter.event.is_set():
            return []


class LongPollApp:
    """ASGI: serves an agent token's `GET /api/v1/commands`; hands every other request
    (users' lists and tokens, bad tokens, other paths) to `app`, Django."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != COMMANDS_PATH
            or scope["method"] != "GET"
            or not _host_allowed(scope)  # Django answers 400 as for any other page
        ):
            await self.app(scope, receive, send)
            return
        secret = _bearer(scope)
        try:
            token = await _db(token_authenticate, secret=secret) if secret else None
        except DatabaseError:
            await _answer(send, 503, _errors("", "database unavailable, retry later"))
            return
        if token is None:  # a user, or a bad token: Django answers as the sync view does
            await self.app(scope, receive, send)
            return
        status, body = await self._poll(scope, receive, token)
        if body is not None:
            await _answer(send, status, body)

    async def _poll(
        self, scope: dict, receive: Callable, token: AgentToken
    ) -> tuple[int, dict[str, Any] | None]:
        params = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), True))
        nul = next((name for name, value in params.items() if NUL in name + value), None)
        if nul is not None:
            return 400, _errors(nul if NUL not in nul else "query", NUL_MESSAGE)
        try:
            query = CommandsQuery.model_validate(params)
        except pydantic.ValidationError as exc:
            return 400, {"errors": validation_errors(exc.errors(include_url=False))}
        if not query.node:
            return 400, _errors("node", "an agent polls for one node")
        if not token.acts_for(query.node):
            return 403, _errors("node", NODE_NOT_OURS)
        try:
            handed = await poll_async(
                cluster_id=token.cluster_id,
                node_name=query.node,
                kinds=query.kind_set,
                wait=query.wait,
                receive=receive,
                run=query.run,
            )
        except DatabaseError:
            return 503, _errors("", "database unavailable, retry later")
        return 200, ({"commands": handed} if handed is not None else None)


async def _disconnected(receive: Callable, waiter: _Waiter) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    waiter.gone = True
    waiter.event.set()


def _host_allowed(scope: dict) -> bool:
    """The Host header names a host of ALLOWED_HOSTS, as Django's own check has it."""
    host = next((v.decode("latin-1") for n, v in scope.get("headers", ()) if n == b"host"), "")
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _bearer(scope: dict) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, secret = value.decode("latin-1").partition(" ")
            return secret.strip() if scheme.lower() == "bearer" else ""
    return ""


def _errors(loc: str, msg: str) -> dict[str, Any]:
    return {"errors": [{"loc": loc, "msg": msg}]}


async def _answer(send: Callable, status: int, data: dict[str, Any]) -> None:
    body = orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"cache-control", b"no-store"),
    ]
    if status == 503:
        headers.append((b"retry-after", str(settings.INGEST_RETRY_AFTER).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
