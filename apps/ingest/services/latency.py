"""opsboard_ingest_batch_latency_seconds: from a batch's accept (its inbox row's
`received_at`, the database's clock) to the commit that stored it, observed by the worker
after that commit (apps.core.counters: in memory, flushed to Redis by a thread)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from apps.core.counters import histogram_observe

BATCH_LATENCY = "opsboard_ingest_batch_latency_seconds"
BATCH_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def batches_latency_observe(*, received: Iterable[datetime]) -> None:
    now = timezone.now()
    for received_at in received:
        seconds = max(0.0, (now - received_at).total_seconds())
        histogram_observe(BATCH_LATENCY, seconds, BATCH_LATENCY_BUCKETS)
