"""The long-poll where WSGI receives it (apps.commands.longpoll has the whole picture): sent on
to the ASGI server by a 307 when the client follows one, else served in this worker."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection
from typing import Any

import redis
from django.conf import settings
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpRequest, HttpResponse
from django.http.request import split_domain_port

from apps.commands.longpoll import deliver_json, kind_wanted
from apps.commands.wakeups import wake_channel

log = logging.getLogger(__name__)


def longpoll_redirect(request: HttpRequest, *, follows: bool) -> HttpResponse | None:
    """307 to the same host, path and query on the ASGI port, when one is configured, this
    request is served by WSGI and its client follows redirects with its token; None
    otherwise (the caller serves the poll itself)."""
    port = settings.LIVE_WS_PORT
    if not port or not follows or not isinstance(request, WSGIRequest):
        return None
    host, _ = split_domain_port(request.get_host())
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    response = HttpResponse(status=307)
    response["Location"] = f"{request.scheme}://{host}:{port}{request.get_full_path()}"
    return response


def poll_sync(
    *,
    cluster_id: int,
    node_name: str,
    kinds: Collection[str] | None,
    wait: float,
    run: str | None = None,
) -> list[dict[str, Any]]:
    """Serve a long-poll in this thread: woken by the node's wake channel, the database
    looked at again every COMMANDS_RECHECK_S (every COMMANDS_POLL_INTERVAL_S while Redis is
    unreachable)."""
    deadline = time.monotonic() + wait
    # subscribed before the first look, so that no wake-up falls between the two
    pubsub = _subscribe_sync(wake_channel(cluster_id, node_name)) if wait > 0 else None
    try:
        while True:
            handed = deliver_json(cluster_id=cluster_id, node_name=node_name, kinds=kinds, run=run)
            remaining = deadline - time.monotonic()
            if handed or remaining <= 0:
                return handed
            pubsub = _await_wake_sync(pubsub, kinds, min(remaining, settings.COMMANDS_RECHECK_S))
    finally:
        if pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                pubsub.close()


def _subscribe_sync(channel: str) -> redis.client.PubSub | None:
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(channel)
        return pubsub
    except (redis.RedisError, OSError) as exc:
        log.warning("long-poll without wake-ups (%s): polling the database", exc)
        return None


def _await_wake_sync(
    pubsub: redis.client.PubSub | None, kinds: Collection[str] | None, timeout: float
) -> redis.client.PubSub | None:
    """Until a wake-up for one of `kinds` or `timeout`; the subscription (None once lost)."""
    if pubsub is None:
        time.sleep(min(timeout, settings.COMMANDS_POLL_INTERVAL_S))
        return None
    until = time.monotonic() + timeout
    try:
        while (left := until - time.monotonic()) > 0:
            message = pubsub.get_message(timeout=left)
            if message and kind_wanted(message.get("data"), kinds):
                return pubsub
    except (redis.RedisError, OSError) as exc:
        log.warning("long-poll lost its wake-ups (%s): polling the database", exc)
        return None
    return pubsub
