"""Counters and per-process gauges shared by every process of a deployment, kept in Redis.

Opsboard runs many processes on many hosts: gunicorn pools, uvicorn, Celery workers. A
Prometheus scrape reaches one web process, so what another process counted must be readable
from there. Why Redis and not prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR):
that mode adds up files in one directory of one host, so an ingest worker on another host is
never seen; it needs the variable set before the first import in every process and the
directory wiped on each deploy, and it leaves a dead process's live gauges behind. Redis is
already shared by every process (the broker, the rate limits, the skipped periodic passes of
`apps.alerts.services.periodic_skip_count`), and a scrape of any web process reads one hash.

The hot paths pay no round trip: `counter_add` adds to a dict in memory, and a daemon thread
of the process flushes the sums to Redis (HINCRBYFLOAT, one pipeline) every FLUSH_S seconds.
With Redis unreachable the sums wait in memory for the next flush (counters are never lost
while the process lives); a process killed with -9 loses at most its last FLUSH_S seconds.

Per-process gauges (`gauge_add`: websocket clients) are written as "<host>:<pid>" fields
with the time they were written, rewritten every GAUGE_REFRESH_S while the process lives; a
reader ignores (and deletes) the fields of processes not heard from for GAUGE_STALE_S, so a
killed process's clients stop counting.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from functools import lru_cache

import redis
from django.conf import settings

from apps.core.redis import redis_client

logger = logging.getLogger(__name__)

FLUSH_S = 1.0
GAUGE_REFRESH_S = 30.0
GAUGE_STALE_S = 120.0
COUNTERS_KEY = "{prefix}:metrics:counters"
GAUGES_KEY = "{prefix}:metrics:gauges"

Labels = tuple[tuple[str, str], ...]

_lock = threading.Lock()
_pending: Counter[str] = Counter()
_gauges: dict[str, float] = {}
_gauges_changed = False
_gauges_written = 0.0
_flusher_pid: int | None = None
_redis_down = False
_wake = threading.Event()


def counter_add(name: str, labels: Mapping[str, str] | None = None, amount: float = 1) -> None:
    """Add `amount` to the deployment-wide counter `name{labels}` (flushed within FLUSH_S)."""
    field = _field(name, tuple(sorted((labels or {}).items())))
    with _lock:
        _pending[field] += amount
    _flusher_ensure()


def histogram_observe(name: str, value: float, buckets: tuple[float, ...]) -> None:
    """Count `value` in the histogram `name`: in the first bucket it fits (the reader makes
    them cumulative), in `name_count` and `name_sum`."""
    le = next((bound for bound in buckets if value <= bound), float("inf"))
    with _lock:
        _pending[_field(f"{name}_bucket", (("le", _le(le)),))] += 1
        _pending[_field(f"{name}_count", ())] += 1
        _pending[_field(f"{name}_sum", ())] += value
    _flusher_ensure()


def gauge_add(name: str, delta: float) -> None:
    """Move this process's part of the gauge `name` (the reader adds up the processes)."""
    global _gauges_changed
    with _lock:
        _gauges[name] = _gauges.get(name, 0.0) + delta
        _gauges_changed = True
    _flusher_ensure()


@lru_cache(maxsize=1024)
def _field(name: str, labels: Labels) -> str:
    """The Redis hash field of a series (cached: the hot paths count a few series only)."""
    return json.dumps([name, labels], separators=(",", ":"))


def counters_read() -> dict[tuple[str, Labels], float]:
    """Every counter of the deployment: (name, labels) → value. Raises redis.RedisError."""
    flush()  # this process's own counts, so that a scrape sees them at once
    raw = redis_client().hgetall(_key(COUNTERS_KEY))
    values: dict[tuple[str, Labels], float] = {}
    for field, value in raw.items():
        name, labels = json.loads(field)
        values[(name, tuple((k, v) for k, v in labels))] = float(value)
    return values


def gauges_read(*, now: float | None = None) -> dict[str, float]:
    """Every per-process gauge, summed over the processes heard from within GAUGE_STALE_S;
    the fields of the others are deleted. Raises redis.RedisError."""
    flush()
    now = time.time() if now is None else now
    client = redis_client()
    key = _key(GAUGES_KEY)
    totals: dict[str, float] = {}
    stale = []
    for field, value in client.hgetall(key).items():
        name = field.decode().split("|", 1)[0]
        amount, written = json.loads(value)
        if now - written > GAUGE_STALE_S:
            stale.append(field)
            continue
        totals[name] = totals.get(name, 0.0) + amount
    if stale:
        client.hdel(key, *stale)
    return totals


def flush() -> None:
    """Write this process's pending counts (and its gauges, when changed or due) to Redis.
    Best effort: on a Redis error the counts are kept for the next flush."""
    global _gauges_changed, _gauges_written, _redis_down
    now = time.time()
    with _lock:
        counts = dict(_pending)
        _pending.clear()
        gauges_due = _gauges_changed or (_gauges and now - _gauges_written > GAUGE_REFRESH_S)
        gauges = dict(_gauges) if gauges_due else {}
        _gauges_changed = False
    if not counts and not gauges:
        return
    try:
        pipe = redis_client().pipeline(transaction=False)
        for field, amount in counts.items():
            pipe.hincrbyfloat(_key(COUNTERS_KEY), field, amount)
        process = f"{socket.gethostname()}:{os.getpid()}"
        for name, value in gauges.items():
            pipe.hset(_key(GAUGES_KEY), f"{name}|{process}", json.dumps([value, now]))
        pipe.execute()
        if gauges:
            _gauges_written = now
        if _redis_down:
            _redis_down = False
            logger.info("redis is back; the counters kept meanwhile are written")
    except redis.RedisError:
        if not _redis_down:  # once per outage, not once a second per process
            _redis_down = True
            logger.warning("redis unavailable; counter updates wait in memory until it is back")
        with _lock:
            _pending.update(counts)
            _gauges_changed = _gauges_changed or bool(gauges)


def _key(template: str) -> str:
    return template.format(prefix=settings.REDIS_PREFIX)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _flusher_ensure() -> None:
    """Start this process's flusher thread once (again in a forked child: threads do not
    survive a fork, and the child's inherited counts are its parent's to flush)."""
    global _flusher_pid
    if _flusher_pid == os.getpid():
        return
    with _lock:
        if _flusher_pid == os.getpid():
            return
        _flusher_pid = os.getpid()
    threading.Thread(target=_flush_forever, name="opsboard-counters", daemon=True).start()


def _flush_forever() -> None:
    while True:
        _wake.wait(FLUSH_S)
        try:
            flush()
        except Exception:  # never let the thread die: counting is best effort
            logger.exception("flushing counters failed")


def _forget_after_fork() -> None:
    global _gauges_changed, _flusher_pid, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _pending.clear()
    _gauges.clear()
    _gauges_changed = False
    _flusher_pid = None


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(lambda: flush() if _flusher_pid == os.getpid() else None)
