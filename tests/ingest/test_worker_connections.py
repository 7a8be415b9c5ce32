"""The ingest worker's Postgres connections: kept across tasks, replaced when they die.

Celery's Django fixup closed a prefork child's connection pool after every task, so each
drain started a Postgres backend of its own (a fifth of the CPU under ingest). The worker
now returns its connection to a pool that outlives the task (opsboard.celery)."""

import threading
import time

import pytest
from django.db import connection

from apps.ingest.models import InboxBatch
from launcher.procs import wait_until
from tests.conftest import make_batch
from tests.stackproc import Process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

APP = "opsboard-test-conn-worker"
SAMPLES = 50


class BackendWatch:
    """Every backend the worker holds, polled while the test runs (a backend per task lives
    as long as its drain, tens of milliseconds: the polls see most of them)."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import psycopg

        from tests.stackproc import database_url

        with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [APP]
                ).fetchall()
                self.pids.update(row[0] for row in rows)
                time.sleep(0.005)


@pytest.fixture
def own_worker(live_stack, live_db):
    """The stack's ingest worker, run with an application name of its own."""
    live_stack.worker.stop()
    worker = Process(
        "conn-worker", live_stack.worker.command, {**live_stack.worker.env, "PGAPPNAME": APP}
    )
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
        live_stack.worker.start()


def post_and_wait(agent, token, prefix: str, count: int) -> None:
    """One batch at a time, each drained before the next: a task per batch."""
    for index in range(count):
        response = agent.post(make_batch(batch_id=f"{prefix}-{index}", samples=SAMPLES))
        assert response.status_code == 202, response.text
        wait_until(
            lambda: not InboxBatch.objects.filter(token=token, processed_at__isnull=True).exists(),
            30,
            "the worker to drain the batch",
            interval=0.01,
        )


def test_a_worker_reuses_its_backends_across_tasks_and_replaces_dead_ones(
    own_worker, agent, agent_token
):
    token = agent_token[0]
    watch = BackendWatch()
    watch.thread.start()
    try:
        post_and_wait(agent, token, "reuse", 20)
        # two pool processes, a connection each (the pool may open one spare)
        assert 1 <= len(watch.pids) <= 4, f"{len(watch.pids)} backends for 20 tasks"

        # the server drops every connection the worker holds (a restart, a failover)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                [APP],
            )
            assert cursor.fetchone()[0] >= 1
        post_and_wait(agent, token, "after-kill", 10)
    finally:
        watch.stop.set()
        watch.thread.join()

    batches = InboxBatch.objects.filter(token=token)
    assert batches.count() == 30
    assert not batches.filter(quarantined_at__isnull=False).exists()  # transient: retried
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(c.n), 0) FROM telemetry_chunk c"
            " JOIN clusters_node n ON n.id = c.node_id WHERE n.cluster_id = %s",
            [token.cluster_id],
        )
        assert cursor.fetchone()[0] == 30 * SAMPLES  # each batch stored once
