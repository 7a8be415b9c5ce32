"""The worker's service, run in-process on real Postgres: what a batch becomes."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

from apps.clusters.models import Cluster, Node
from apps.ingest.services import ClaimedBatch, batches_store
from apps.runs.models import Run, RunEvent, StepReport
from apps.telemetry.models import NodeHealth
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db(transaction=True)


def store(cluster: Cluster, *bodies: dict):
    with transaction.atomic():
        return batches_store(
            batches=[
                ClaimedBatch.of(cluster_id=cluster.pk, received_at=datetime.now(UTC), body=body)
                for body in bodies
            ]
        )


def count(sql: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def test_a_batch_becomes_one_chunk_per_series_its_steps_events_and_latest_health():
    cluster = Cluster.objects.create(name="storage")
    now = time.time()
    body = make_batch(node="node-01", samples=16, steps=4, run="run-1", ts=now)
    body["events"] = [{"ts": now, "kind": "xid", "gpu": 3, "code": 79}]
    result = store(cluster, body)

    assert (result.samples, result.steps, result.events) == (16, 4, 1)
    node = Node.objects.get(cluster=cluster, name="node-01")
    # 16 samples of gpu.util over 8 GPUs: 8 series, one chunk each
    assert count(f"SELECT count(*) FROM telemetry_chunk WHERE node_id = {node.pk}") == 8
    assert count(f"SELECT sum(n) FROM telemetry_chunk WHERE node_id = {node.pk}") == 16
    run = Run.objects.get(cluster=cluster, name="run-1")
    assert (run.world_size, run.last_step) == (4, 100)
    assert StepReport.objects.filter(run=run).count() == 4
    assert RunEvent.objects.get(node=node).data["code"] == 79
    assert NodeHealth.objects.filter(node=node).count() == 8
    assert not node.has_agent, "every batch carried a run: the node has no agent of its own"


def test_the_store_step_marks_what_it_wrote_dirty_for_the_rollups_in_its_transaction():
    cluster = Cluster.objects.create(name="dirty")
    # Counted inside the storing transaction: a rollup pass (the live stack's, if a test of
    # this session started it) cannot claim uncommitted marks, and none are left behind.
    with transaction.atomic():
        store(cluster, make_batch(node="node-01", samples=8, steps=2, run="run-1"))
        node = Node.objects.get(cluster=cluster)
        run = Run.objects.get(cluster=cluster)
        series = count(f"SELECT count(*) FROM history_dirty_series WHERE node_id = {node.pk}")
        runs = count(f"SELECT count(*) FROM history_dirty_run WHERE run_id = {run.pk}")
    assert (series, runs) == (8, 1)


def test_a_batch_without_a_run_comes_from_a_node_agent():
    cluster = Cluster.objects.create(name="agent")
    store(cluster, make_batch(node="node-02", samples=2))
    assert Node.objects.get(cluster=cluster, name="node-02").has_agent
