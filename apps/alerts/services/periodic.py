"""What periodic passes share: a Redis lock that a pass holds while it runs, and the count of
passes that did not run (expired in the queue, or skipped because the previous one still ran).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.conf import settings

from apps.alerts.choices import PERIODIC_SKIPS_KEY
from apps.core.redis import redis_client

logger = logging.getLogger(__name__)

_RELEASE_LOCK = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"
)


@contextmanager
def pass_lock(*, name: str, ttl_s: float) -> Iterator[bool]:
    """Hold the lock `name` (under the deployment's Redis prefix) for the block: yields True
    when this caller holds it, False when someone else does (the block must then do nothing).
    It expires after `ttl_s`, so a pass whose worker was killed blocks the next for at most
    that long; it is released only by its holder (a token), never by a later pass."""
    client = redis_client()
    key, token = f"{settings.REDIS_PREFIX}:{name}", uuid.uuid4().hex
    held = bool(client.set(key, token, nx=True, px=int(ttl_s * 1000)))
    try:
        yield held
    finally:
        if held:
            client.eval(_RELEASE_LOCK, 1, key, token)


def periodic_skip_count(*, task: str, reason: str) -> None:
    """Count a periodic pass that did not run (`expired` in the queue, or an `overlap` with
    a pass still running), per task and reason; best effort (Redis may be what is down)."""
    try:
        redis_client().hincrby(
            PERIODIC_SKIPS_KEY.format(prefix=settings.REDIS_PREFIX), f"{task}:{reason}", 1
        )
    except redis.RedisError:
        logger.warning("could not count a skipped %s pass (%s)", task, reason)
