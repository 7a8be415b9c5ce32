"""Waking a drain for committed inbox rows: one pending drain task per queue (a Redis flag),
and a breaker that stops publishing for a while after the broker failed (the inbox sweep
covers what it skips)."""

from __future__ import annotations

import logging
import threading
import time

import redis
from django.conf import settings

from apps.core.redis import redis_client
from apps.core.tasks import task_enqueue

logger = logging.getLogger(__name__)

BROKER_BACKOFF_S = 5.0
# The task that drains an inbox row (apps/ingest/tasks.py registers it under this name)
BATCH_PROCESS_TASK = "ingest.batch_process"


class _BrokerBreaker:
    """After a failed publish, skip publishing for a while: the inbox sweep covers the gap,
    and agents keep getting fast 202s instead of waiting on a dead broker each time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open_until = 0.0

    def allows(self) -> bool:
        return time.monotonic() >= self._open_until

    def trip(self) -> None:
        with self._lock:
            self._open_until = time.monotonic() + BROKER_BACKOFF_S


_breaker = _BrokerBreaker()


def batch_enqueue(*, inbox_id: int | None) -> bool:
    """Wake a drain for a committed inbox row; True when this call published a drain task.

    One drain task is pending per queue at a time: a call publishes only when it wins the
    pending flag (SET NX, a lease of INGEST_DRAIN_PENDING_TTL). A call that loses needs no
    task of its own: the pending one clears the flag when it starts, before it claims, so it
    sees this row. A row whose wake-up is lost (flag lease on a lost task, broker down) waits
    for the inbox sweep."""
    if not _breaker.allows():
        return False
    taken = _drain_pending_take()
    if taken is None and settings.CELERY_BROKER_URL == settings.REDIS_URL:
        # the flag's Redis, which did not answer, is the broker: a publish would only wait
        # out the broker's socket timeout too (a frozen Redis held a POST 9 s)
        _breaker.trip()
        return False
    if taken is False:
        return False
    try:
        # the id (or None) as the one argument: a worker of the previous version runs it too
        task_enqueue(BATCH_PROCESS_TASK, inbox_id, retry=False)
    except Exception:  # any broker failure: the row is durable, the sweep will enqueue it
        logger.warning("broker unavailable; inbox row %s left for the sweep", inbox_id)
        _breaker.trip()
        drain_pending_clear()  # the lease is on no task: let the next call try again
        return False
    return True


def _drain_pending_key() -> str:
    # one flag per queue: the default queue is named after the prefix
    return f"{settings.REDIS_PREFIX}:ingest:drain-pending"


def _drain_pending_take() -> bool | None:
    """Take the pending flag; True when taken, None when Redis failed (a broker elsewhere
    is published to anyway: a spare task drains nothing, a lost wake-up would wait for the
    sweep)."""
    ttl_ms = max(1, int(settings.INGEST_DRAIN_PENDING_TTL * 1000))
    try:
        return bool(redis_client().set(_drain_pending_key(), b"1", nx=True, px=ttl_ms))
    except redis.RedisError:
        logger.warning("redis unavailable; the drain-pending flag is not taken")
        return None


def drain_pending_clear() -> None:
    try:
        redis_client().delete(_drain_pending_key())
    except redis.RedisError:  # the lease expires by itself; until then the next drain covers
        logger.warning("redis unavailable; the drain-pending flag expires by itself")
