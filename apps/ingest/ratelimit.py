"""Per-token rate limit of the ingest endpoint: a token bucket in Redis, one round trip.

Every web worker shares the bucket (Redis), so the limit holds for the deployment, not per
process. The bucket refills at INGEST_RATE_PER_TOKEN batches per second up to
INGEST_RATE_BURST. The limiter fails open: with Redis unreachable ingest keeps answering
(the inbox is in Postgres), and the limiter is skipped for a few seconds rather than paying
a connection timeout on every request.
"""

from __future__ import annotations

import logging
import math
import time
from functools import cache

import redis
from django.conf import settings
from redis.commands.core import Script

from apps.core.redis import redis_connect

logger = logging.getLogger(__name__)

# Seconds the limiter stays off after Redis failed (fail open without a timeout per request).
REDIS_BACKOFF_S = 5.0

# KEYS[1]: the bucket; ARGV: rate (per second), burst. Returns "0" (take one) or the seconds
# until one batch is allowed. Redis's own clock: web workers on several hosts may disagree.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local last = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - last) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return tostring(wait)
"""

_down_until = 0.0


@cache
def _script() -> Script:
    client = redis_connect(settings.REDIS_URL, timeout=0.5, connect_timeout=0.5)
    # EVALSHA, falling back to EVAL once per process when Redis does not know the script
    return client.register_script(_TAKE)


def ingest_rate_key(*, token_id: int) -> str:
    return f"{settings.REDIS_PREFIX}:ingest:rate:{token_id}"


def ingest_rate_take(*, token_id: int) -> int:
    """Take one batch from the token's bucket: 0 when allowed, else the whole seconds to
    wait (Retry-After, at least 1). Always 0 when the limit is off or Redis is unreachable."""
    global _down_until
    rate, burst = settings.INGEST_RATE_PER_TOKEN, settings.INGEST_RATE_BURST
    if rate <= 0 or burst <= 0 or time.monotonic() < _down_until:
        return 0
    try:
        wait = float(_script()(keys=[ingest_rate_key(token_id=token_id)], args=[rate, burst]))
    except (redis.RedisError, OSError) as error:
        _down_until = time.monotonic() + REDIS_BACKOFF_S
        logger.warning("ingest rate limit off for %.0f s: %s", REDIS_BACKOFF_S, error)
        return 0
    return max(1, math.ceil(wait)) if wait > 0 else 0
