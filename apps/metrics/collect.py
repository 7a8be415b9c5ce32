"""The server's exposition: gauges read from Postgres at scrape time (selectors), counters
and per-process gauges that every process keeps in Redis (apps.core.counters).

Every name here is in docs/operations.md and on the dashboard (docs/grafana/opsboard.json).
With Redis unreachable the scrape still answers: `opsboard_redis_up` is 0 and the series
kept in Redis are missing, the database's are there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from apps.alerts.selectors import periodic_skips
from apps.core.counters import Labels, counters_read, gauges_read
from apps.ingest.middleware import INGEST_BATCHES, REMOTE_WRITE_REQUESTS, REMOTE_WRITE_SAMPLES
from apps.ingest.services.latency import BATCH_LATENCY, BATCH_LATENCY_BUCKETS
from apps.live.consumers import WS_CLIENTS
from apps.metrics import selectors

logger = logging.getLogger(__name__)


def exposition() -> bytes:
    """The text exposition (format 0.0.4) of everything below."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OpsboardCollector())
    return generate_latest(registry)


class OpsboardCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = time.time()
        yield from _database(now)
        yield from _redis(now)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _database(now: float) -> Iterator[Metric]:
    state = selectors.deployment_state()
    yield _gauge(
        "opsboard_inbox_backlog_batches", "Accepted batches not yet stored", state.inbox_backlog
    )
    oldest = state.inbox_oldest_age_s or 0.0
    yield _gauge(
        "opsboard_inbox_oldest_age_seconds",
        "Age of the oldest batch not yet stored",
        max(0.0, oldest),
    )
    yield _gauge(
        "opsboard_inbox_quarantined_batches",
        "Batches set aside as unstorable (admin: quarantined batches)",
        state.inbox_quarantined,
    )
    # Rollups catch up when a pass leaves nothing dirty; the lag is the time since then.
    lag = now - state.rolled_up_at.timestamp() if state.rolled_up_at else 0.0
    yield _gauge(
        "opsboard_rollup_lag_seconds", "Seconds since the rollups were last caught up", lag
    )
    for name, doc, label, counts in (
        ("opsboard_alerts", "Open alerts by state", "state", state.alerts),
        ("opsboard_commands", "Commands not yet finished, by state", "state", state.commands),
        ("opsboard_webhook_deliveries", "Undelivered webhook deliveries", "state", state.webhooks),
    ):
        family = GaugeMetricFamily(name, doc, labels=[label])
        for value, count in sorted(counts.items()):
            family.add_metric([value], count)
        yield family
    duration = GaugeMetricFamily(
        "opsboard_detector_pass_duration_seconds",
        "How long the last detector pass took",
        labels=["cluster"],
    )
    age = GaugeMetricFamily(
        "opsboard_detector_pass_age_seconds",
        "Seconds since the last detector pass ended",
        labels=["cluster"],
    )
    for row in selectors.detector_passes():
        duration.add_metric([row.cluster], row.duration_s)
        age.add_metric([row.cluster], max(0.0, now - row.ran_at.timestamp()))
    yield duration
    yield age


def _redis(now: float) -> Iterator[Metric]:
    try:
        counters = counters_read()
        gauges = gauges_read(now=now)
        skips = periodic_skips()
    except redis.RedisError as exc:
        logger.warning("metrics: redis unavailable (%s); its series are left out", exc)
        yield _gauge("opsboard_redis_up", "Whether the scrape could read Redis", 0)
        return
    yield _gauge("opsboard_redis_up", "Whether the scrape could read Redis", 1)
    yield _counter(
        counters,
        INGEST_BATCHES,
        "Answers to POST /api/v1/ingest: accepted (202), duplicate (200), refused (any other)",
        ["outcome", "status"],
    )
    yield _counter(
        counters,
        REMOTE_WRITE_REQUESTS,
        "Answers to POST /api/v1/write: accepted (202), nothing new (200), refused (any other)",
        ["outcome", "status"],
    )
    yield _counter(
        counters,
        REMOTE_WRITE_SAMPLES,
        "Remote-written samples: accepted, replayed (accepted before), dropped, refused",
        ["outcome"],
    )
    yield _histogram(counters, BATCH_LATENCY, "Seconds from a batch's accept to its storing")
    skipped = CounterMetricFamily(
        "opsboard_periodic_skipped", "Periodic passes that did not run", labels=["task", "reason"]
    )
    for key, count in sorted(skips.items()):
        task, _, reason = key.rpartition(":")
        skipped.add_metric([task, reason], count)
    yield skipped
    yield _gauge(
        "opsboard_websocket_clients", "Open websockets of the live pages", gauges.get(WS_CLIENTS, 0)
    )


def _series(counters: dict[tuple[str, Labels], float], name: str) -> list[tuple[Labels, float]]:
    return sorted((labels, value) for (each, labels), value in counters.items() if each == name)


def _counter(
    counters: dict[tuple[str, Labels], float], name: str, doc: str, labels: list[str]
) -> Metric:
    """The deployment-wide counter `name` (apps.core.counters) as a family with `labels`."""
    family = CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels)
    for each, value in _series(counters, name):
        given = dict(each)
        family.add_metric([given[label] for label in labels], value)
    return family


def _histogram(counters: dict[tuple[str, Labels], float], name: str, doc: str) -> Metric:
    per_bucket: dict[float, float] = dict.fromkeys(BATCH_LATENCY_BUCKETS, 0.0)
    for labels, value in _series(counters, f"{name}_bucket"):
        bound = float(dict(labels)["le"])
        per_bucket[bound] = per_bucket.get(bound, 0.0) + value
    per_bucket.setdefault(float("inf"), 0.0)
    cumulative, buckets = 0.0, []
    for bound in sorted(per_bucket):
        cumulative += per_bucket[bound]
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    total = counters.get((f"{name}_sum", ()), 0.0)
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)
