"""The process's Redis client (live feed marks, rate limits, counters): one per process.

Every client a request may wait on is built by `redis_connect`: its socket timeouts are the
longest a call waits (docs/faults.md, "Bounds"). redis-py (6 and later) otherwise retries a
command 3 times, reconnecting each time, with backoff: against a frozen Redis one call with
a 2 s socket timeout took 25 s. Here a broken connection (a Redis that restarted) is retried
once, at once; a timeout is final."""

from functools import cache

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry


def redis_connect(url: str, *, timeout: float, connect_timeout: float) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
    )


@cache
def redis_client() -> redis.Redis:
    return redis_connect(settings.REDIS_URL, timeout=2, connect_timeout=1)
