"""One pending drain task per queue: a POST publishes only when no drain is pending, the
drain clears the flag before it claims (so it stores the rows of the POSTs that did not
publish), hands on when it stops with rows left, and Redis failing never loses a wake-up."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from celery import current_app
from django.test import override_settings

from apps.clusters.services import token_issue
from apps.core.redis import redis_client
from apps.core.tasks import queue_length
from apps.ingest.models import InboxBatch
from apps.ingest.services import batch_accept, inbox_drain_pending
from apps.telemetry.selectors import chunk_storage
from tests.conftest import make_batch

SAMPLES = 20


@pytest.fixture
def quiet_drains(live_db, settings):
    """Drain tasks go to a queue no worker consumes, under a flag of their own (a live stack
    in the same session keeps its own); returns the queue, emptied afterwards."""
    prefix = f"{settings.REDIS_PREFIX}-drain-{uuid.uuid4().hex[:8]}"
    settings.REDIS_PREFIX = prefix
    default_queue = current_app.conf.task_default_queue
    current_app.conf.task_default_queue = prefix
    yield prefix
    current_app.conf.task_default_queue = default_queue
    redis_client().delete(f"{prefix}:ingest:drain-pending")
    with current_app.connection_for_write() as broker:
        broker.default_channel.queue_purge(prefix)
        broker.default_channel.queue_delete(prefix)


@pytest.fixture
def token(live_db):
    return token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}", name="drain")[0]


def accept(token, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        body = json.dumps(make_batch(samples=SAMPLES, node=f"n-{len(ids) % 3}")).encode()
        inbox_id = batch_accept(token=token, batch_id=uuid.uuid4().hex, payload=body)
        assert inbox_id is not None
        ids.append(inbox_id)
    return ids


def unprocessed(token) -> int:
    return InboxBatch.objects.filter(token=token, processed_at__isnull=True).count()


def test_it_publishes_one_drain_while_one_is_pending_and_that_drain_stores_every_row(
    quiet_drains, token
):
    accept(token, 1)
    assert queue_length(quiet_drains) == 1
    accept(token, 4)
    assert queue_length(quiet_drains) == 1, "the pending drain covers these POSTs"

    drained = inbox_drain_pending(first_id=None)  # what the pending task runs

    assert drained.batches == 5
    assert unprocessed(token) == 0
    assert chunk_storage()["samples"] == 5 * SAMPLES
    accept(token, 1)
    assert queue_length(quiet_drains) == 2, "the drain cleared the flag: the next POST publishes"


def test_a_drain_that_stops_with_rows_left_publishes_the_next_one(quiet_drains, token, settings):
    settings.INGEST_DRAIN_ROWS, settings.INGEST_DRAIN_TASK_ROUNDS = 2, 2
    accept(token, 7)
    assert queue_length(quiet_drains) == 1

    assert inbox_drain_pending(first_id=None).batches == 4
    assert unprocessed(token) == 3
    assert queue_length(quiet_drains) == 2, "rows were left: it handed on"

    assert inbox_drain_pending(first_id=None).batches == 3
    assert unprocessed(token) == 0
    assert queue_length(quiet_drains) == 2, "it emptied the inbox: nothing to hand on"
    assert chunk_storage()["samples"] == 7 * SAMPLES


def test_a_drain_named_by_an_older_task_or_the_sweep_takes_its_row_first(quiet_drains, token):
    ids = accept(token, 3)
    assert inbox_drain_pending(first_id=ids[2]).batches == 3
    assert inbox_drain_pending(first_id=ids[0]).batches == 0, "a processed row never again"
    assert chunk_storage()["samples"] == 3 * SAMPLES


def test_it_publishes_every_drain_when_the_flag_store_is_unreachable(quiet_drains, token):
    redis_client.cache_clear()
    try:  # the flag's Redis is down; the broker stays up
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
            accept(token, 3)
            assert queue_length(quiet_drains) == 3, "no flag: each POST wakes a drain"
            assert inbox_drain_pending(first_id=None).batches == 3
    finally:
        redis_client.cache_clear()
    assert unprocessed(token) == 0


@pytest.mark.timeout(180)
def test_concurrent_posts_are_all_stored_exactly_once(agent, agent_token):
    token = agent_token[0]
    posts, threads_count = 60, 6
    statuses: list[int] = []

    def send(thread: int) -> None:
        for index in range(posts // threads_count):
            batch = make_batch(batch_id=f"t{thread}-{index}", node=f"n-{thread}", samples=SAMPLES)
            statuses.append(agent.post(batch).status_code)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [202] * posts

    deadline = time.monotonic() + 60
    while unprocessed(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert unprocessed(token) == 0
    assert InboxBatch.objects.filter(token=token, quarantined_at__isnull=False).count() == 0
    assert InboxBatch.objects.filter(token=token).count() == posts
    assert chunk_storage()["samples"] == posts * SAMPLES


def test_a_lost_drain_blocks_wake_ups_no_longer_than_its_lease(quiet_drains, token, settings):
    settings.INGEST_DRAIN_PENDING_TTL = 0.3
    accept(token, 1)
    with current_app.connection_for_write() as broker:
        broker.default_channel.queue_purge(quiet_drains)  # the pending task is lost
    accept(token, 1)
    assert queue_length(quiet_drains) == 0, "inside the lease the flag still stands"
    time.sleep(0.4)
    accept(token, 1)
    assert queue_length(quiet_drains) == 1, "past the lease the next POST wakes a drain"
    assert inbox_drain_pending(first_id=None).batches == 3
