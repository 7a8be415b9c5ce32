"""Backpressure: a POST waits, briefly, while the inbox holds more than the workers will
drain in about a second.

Under overload the inbox is a queue that only grows, and live lag grows with it (every
batch waits behind the backlog). Holding an agent's POST a little instead leaves the excess
in the agents' spools, where it belongs, and keeps the backlog, and so the lag, bounded.
The wait is bounded too: past INGEST_BACKLOG_WAIT_S the batch is accepted anyway (a backlog
that does not drain means the workers are down, and the inbox is then the durable buffer it
is for), so no batch is ever refused for load. And a POST waits only while the workers are
draining (a drain committed within DRAINING_WITHIN_S, a Redis timestamp each drain sets):
with the workers stopped, waiting would only make every agent slow for nothing."""

from __future__ import annotations

import logging
import threading
import time

import redis
from django.conf import settings
from django.db import connection

from apps.core.redis import redis_client

logger = logging.getLogger(__name__)

# The backlog is read at most this often per process (it changes at ~100 rows a second).
_READ_EVERY_S = 0.1
_POLL_S = 0.05
# A drain commits every few hundred ms while a backlog lasts: longer without one, the workers
# are stopped, stuck or gone.
DRAINING_WITHIN_S = 1.0


def _drained_key() -> str:
    return f"{settings.REDIS_PREFIX}:ingest:drained-at"


def drain_heartbeat() -> None:
    """Record that a drain committed now (called on the drain's commit)."""
    try:
        redis_client().set(_drained_key(), repr(time.time()), px=10_000)
    except redis.RedisError:  # no heartbeat: POSTs just do not wait
        logger.warning("redis unavailable; the drain heartbeat is skipped")


def workers_draining() -> bool:
    try:
        stamp = redis_client().get(_drained_key())
    except redis.RedisError:
        return False
    return stamp is not None and time.time() - float(stamp) < DRAINING_WITHIN_S


_lock = threading.Lock()
_last: tuple[float, bool] = (0.0, False)  # (monotonic time read, over the limit)


def backlog_over_limit() -> bool:
    """True while more than INGEST_BACKLOG_ROWS inbox rows wait (0 turns this off) and the
    workers are draining them."""
    global _last
    limit = settings.INGEST_BACKLOG_ROWS
    if limit <= 0:
        return False
    now = time.monotonic()
    with _lock:
        if now - _last[0] < _READ_EVERY_S:
            return _last[1]
    with connection.cursor() as cursor:
        # the partial index of unprocessed rows: at most limit + 1 entries are read
        cursor.execute(
            "SELECT count(*) FROM (SELECT 1 FROM ingest_inboxbatch"
            " WHERE processed_at IS NULL LIMIT %s) waiting",
            [limit + 1],
        )
        over = cursor.fetchone()[0] > limit
    over = over and workers_draining()
    with _lock:
        _last = (now, over)
    return over


def backlog_wait() -> float:
    """Wait while the backlog is over its limit, at most INGEST_BACKLOG_WAIT_S; returns the
    seconds waited."""
    started = time.monotonic()
    deadline = started + settings.INGEST_BACKLOG_WAIT_S
    while time.monotonic() < deadline and backlog_over_limit():
        time.sleep(_POLL_S)
    return time.monotonic() - started
