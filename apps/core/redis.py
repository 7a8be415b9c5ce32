"""The process's Redis client (live feed marks, rate limits, counters): one per process."""

from functools import cache

import redis
from django.conf import settings


@cache
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=1)
