"""The inbox sweep sends one task per INGEST_DRAIN_ROWS waiting rows, less the tasks already
queued: it runs on its own worker, on time, and must not double a backlog at every pass."""

from __future__ import annotations

import uuid

import pytest
from celery import current_app
from django.conf import settings
from django.db import connection

from apps.clusters.services import token_issue
from apps.core.tasks import queue_length
from apps.ingest.services import inbox_sweep


@pytest.fixture
def quiet_queue():
    """A queue no worker consumes, emptied afterwards."""
    queue = f"{settings.REDIS_PREFIX}-sweep-{uuid.uuid4().hex[:8]}"
    yield queue
    with current_app.connection_for_write() as broker:
        broker.default_channel.queue_purge(queue)
        broker.default_channel.queue_delete(queue)


def test_a_sweep_tops_the_queue_up_to_one_task_per_drain_and_the_next_adds_none(
    transactional_db, quiet_queue
):
    token, _ = token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}", name="sweep")
    rows = 2 * settings.INGEST_DRAIN_ROWS + 5  # three drains' worth
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ingest_inboxbatch (token_id, batch_id, received_at, payload,"
            " payload_encoding) SELECT %s, 'b' || g, now() - interval '1 hour', '{}', 'identity'"
            " FROM generate_series(1, %s) AS g",
            [token.pk, rows],
        )
    sent = inbox_sweep(older_than_s=60, queue=quiet_queue)
    assert sent == 3
    assert queue_length(quiet_queue) == 3
    assert inbox_sweep(older_than_s=60, queue=quiet_queue) == 0, (
        "the queued tasks already cover the rows"
    )
    assert queue_length(quiet_queue) == 3
    left_alone = inbox_sweep(older_than_s=7200, queue=quiet_queue)
    assert left_alone == 0, "rows younger than the age are left alone"
