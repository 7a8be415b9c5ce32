"""Sending to a Channels group from synchronous code, on one long-lived event loop per process.

`async_to_sync(layer.group_send)` starts a new event loop for each call, and channels_redis
keeps its Redis connections per loop, so every send opened a connection and closed it again
(about 2–3 ms, most of a command's acknowledgement). Here the sends go to one loop that a
daemon thread runs for the life of the process, and its connections stay open. A forked
child (a Celery prefork worker, a gunicorn worker) starts its own loop on its first send.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from channels.layers import get_channel_layer

SEND_TIMEOUT_S = 5.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None


def group_send(group: str, message: dict[str, Any], *, timeout: float = SEND_TIMEOUT_S) -> None:
    """Send `message` to `group` and wait for the layer to take it. Raises what the layer
    raises (redis.RedisError, OSError); TimeoutError, an OSError, after `timeout` seconds."""
    future = asyncio.run_coroutine_threadsafe(
        get_channel_layer().group_send(group, message), _sender_loop()
    )
    try:
        future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise


def _sender_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="opsboard-group-send", daemon=True
            ).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop
