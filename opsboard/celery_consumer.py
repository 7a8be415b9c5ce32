"""The workers' Celery consumer (settings.CELERY_WORKER_CONSUMER): Celery's own, reconnecting
to a lost broker at once and then every BROKER_RECONNECT_MAX_S.

Celery retries a lost broker with kombu's default waits, 2, 4, 6, … up to 30 s, and no
setting changes them: after a 20 s Redis outage the ingest worker came back 10 s after
Redis did, and after a minute up to 30 s (docs/faults.md, 7: the live pages showed stale
health all that time). A connection attempt to a local Redis costs next to nothing."""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer
from django.conf import settings


class PromptReconnectConsumer(Consumer):
    def ensure_connected(self, conn: Any) -> Any:
        wait = settings.BROKER_RECONNECT_MAX_S
        # the class's method, not the instance's: a reused connection gets one wrapper
        conn.ensure_connection = functools.partial(
            type(conn).ensure_connection, conn, interval_start=0, interval_step=wait,
            interval_max=wait,
        )  # fmt: skip
        return super().ensure_connected(conn)
