"""/metrics after real ingest through the live stack (web server, Celery worker, beat): the
counters the stack's processes keep in Redis and the gauges read from Postgres move."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client, override_settings
from django.utils import timezone

from apps.alerts.models import DetectorPass
from apps.clusters.models import Cluster
from apps.ingest.models import InboxBatch
from launcher.procs import wait_until
from tests.conftest import make_batch
from tests.metrics.scrape import AUTH, TOKEN, parse, value

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

FLUSH_SETTLE_S = 1.5  # apps.core.counters.FLUSH_S, and a margin


def scrape() -> dict:
    with override_settings(METRICS_TOKEN=TOKEN):
        response = Client().get("/metrics", **AUTH)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())[0]


def ingest(samples: dict) -> dict[str, float]:
    return {
        "accepted": value(
            samples, "opsboard_ingest_batches_total", outcome="accepted", status="202"
        ),
        "duplicate": value(
            samples, "opsboard_ingest_batches_total", outcome="duplicate", status="200"
        ),
        "401": value(samples, "opsboard_ingest_batches_total", outcome="refused", status="401"),
        "400": value(samples, "opsboard_ingest_batches_total", outcome="refused", status="400"),
        "latency": value(samples, "opsboard_ingest_batch_latency_seconds_count"),
        "latency_inf": value(samples, "opsboard_ingest_batch_latency_seconds_bucket", le="+Inf"),
    }


def test_it_counts_what_the_stack_answers_and_stores(agent, agent_token):
    time.sleep(FLUSH_SETTLE_S)  # earlier tests' counts have reached Redis
    before = ingest(scrape())
    batches = [make_batch(node=f"n{i}") for i in range(3)]
    for batch in batches:
        assert agent.post(batch).status_code == 202
    assert agent.post(batches[0]).status_code == 200
    assert agent.post(make_batch(), secret="not-a-token").status_code == 401
    assert agent.post(b'{"batch_id": 1}').status_code == 400
    wait_until(
        lambda: not InboxBatch.objects.filter(token=agent_token[0], processed_at=None).exists(),
        30,
        "the batches to be stored",
    )
    expected = {"accepted": 3, "duplicate": 1, "401": 1, "400": 1, "latency": 3, "latency_inf": 3}

    def moved() -> bool:
        after = ingest(scrape())
        return all(after[key] - before[key] >= count for key, count in expected.items())

    wait_until(moved, 10, "the counters to move")
    time.sleep(FLUSH_SETTLE_S)
    after = ingest(scrape())
    assert {key: after[key] - before[key] for key in expected} == expected
    # beat's evaluation covers the cluster that just sent data: its pass shows up by name
    cluster = agent_token[0].cluster.name

    def evaluated() -> bool:
        age = scrape().get(("opsboard_detector_pass_age_seconds", (("cluster", cluster),)))
        return age is not None

    wait_until(evaluated, 30, "the cluster's detector pass")
    samples = scrape()
    assert 0 <= value(samples, "opsboard_detector_pass_age_seconds", cluster=cluster) < 30
    assert value(samples, "opsboard_detector_pass_duration_seconds", cluster=cluster) > 0
    assert value(samples, "opsboard_redis_up") == 1


def test_the_inbox_gauges_show_a_waiting_batch_then_its_quarantine(agent, agent_token):
    quarantined = value(scrape(), "opsboard_inbox_quarantined_batches")
    # Uncommitted: this connection (the scrape's) sees the row, the worker does not yet.
    with transaction.atomic():
        InboxBatch.objects.create(token=agent_token[0], batch_id=uuid.uuid4().hex, payload=b"{")
        InboxBatch.objects.filter(token=agent_token[0], processed_at=None).update(
            received_at=timezone.now() - timedelta(seconds=120)
        )
        samples = scrape()
        assert value(samples, "opsboard_inbox_backlog_batches") >= 1
        assert value(samples, "opsboard_inbox_oldest_age_seconds") >= 119
    # committed: the sweep hands it to the worker, which quarantines it (not JSON)
    wait_until(
        lambda: value(scrape(), "opsboard_inbox_quarantined_batches") == quarantined + 1,
        30,
        "the bad batch to be quarantined",
    )
    samples = scrape()
    assert value(samples, "opsboard_inbox_backlog_batches") == 0
    assert value(samples, "opsboard_inbox_oldest_age_seconds") == 0


def test_a_scrape_costs_three_queries_however_many_clusters(live_db, django_assert_num_queries):
    for index in range(20):
        cluster = Cluster.objects.create(name=f"m-{index}-{uuid.uuid4().hex[:6]}")
        DetectorPass.objects.create(cluster=cluster, ran_at="2026-01-01T00:00:00Z", duration_s=0.5)
    scrape()  # the connection, and the migrations check of nothing else
    with django_assert_num_queries(3):
        samples = scrape()
    passes = [key for key in samples if key[0] == "opsboard_detector_pass_age_seconds"]
    assert len(passes) >= 20
