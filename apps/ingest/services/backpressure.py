"""Backpressure: a POST waits, briefly, while the inbox holds more than the workers will
drain in about a second.

Under overload the inbox is a queue that only grows, and live lag grows with it (every
batch waits behind the backlog). Holding an agent's POST a little instead leaves the excess
in the agents' spools, where it belongs, and keeps the backlog, and so the lag, bounded.
The wait is bounded too: past INGEST_BACKLOG_WAIT_S the batch is accepted anyway (a backlog
that does not drain means the workers are down, and the inbox is then the durable buffer it
is for), so no batch is ever refused for load."""

from __future__ import annotations

import threading
import time

from django.conf import settings
from django.db import connection

# The backlog is read at most this often per process (it changes at ~100 rows a second).
_READ_EVERY_S = 0.1
_POLL_S = 0.05

_lock = threading.Lock()
_last: tuple[float, bool] = (0.0, False)  # (monotonic time read, over the limit)


def backlog_over_limit() -> bool:
    """True while more than INGEST_BACKLOG_ROWS inbox rows wait (0 turns this off)."""
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
