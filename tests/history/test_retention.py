"""Pruning: each resolution loses only what is older than its own retention, in batches."""

import time

import pytest
from django.utils import timezone

from apps.history.services import history_prune
from apps.runs.models import Run
from tests.history.helpers import cluster_nodes, rows, samples_put, steps_put

pytestmark = pytest.mark.django_db

DAY = 86400


def rollup_rows_put(days_ago: list[float]) -> None:
    """One sample and one step rollup row per age, in every rollup table."""
    for table in ("history_sample_1m", "history_sample_1h"):
        rows(
            f"INSERT INTO {table} (node_id, metric_id, gpu, bucket, n, vsum, vmin, vmax)"
            " SELECT 1, 1, 0, now() - make_interval(secs => d * 86400), 1, 1, 1, 1"
            " FROM unnest(%s::float8[]) d RETURNING 1",
            [days_ago],
        )
    for table in ("history_step_10s", "history_step_1m", "history_step_10m", "history_step_1h"):
        rows(
            f"INSERT INTO {table} (run_id, rank, bucket, n, max_step, step_time_sum,"
            " step_time_max, data_time_n, h2d_time_n, compute_time_n, comm_wait_n, loss_n)"
            " SELECT 1, 0, now() - make_interval(secs => d * 86400), 1, 1, 1, 1, 0, 0, 0, 0, 0"
            " FROM unnest(%s::float8[]) d RETURNING 1",
            [days_ago],
        )
    for table in ("history_runstep_10s", "history_runstep_1m", "history_runstep_1h"):
        rows(
            f"INSERT INTO {table} (run_id, bucket, ranks, n, max_step, step_time_sum,"
            " step_time_max, data_time_n, h2d_time_n, compute_time_n, comm_wait_n, loss_n)"
            " SELECT 1, now() - make_interval(secs => d * 86400), 1, 1, 1, 1, 1, 0, 0, 0, 0, 0"
            " FROM unnest(%s::float8[]) d RETURNING 1",
            [days_ago],
        )


def ages(table: str, column: str = "bucket") -> list[int]:
    return [
        row[0]
        for row in rows(
            f"SELECT DISTINCT floor(extract(epoch FROM now() - {column}) / 86400)::int"
            f" FROM {table} ORDER BY 1"
        )
    ]


def test_it_prunes_each_resolution_by_its_own_retention(settings):
    settings.HISTORY_1H_RETENTION_DAYS = 365
    settings.HISTORY_10M_RETENTION_DAYS = 200
    settings.HISTORY_10S_RETENTION_DAYS = 7.5
    node = cluster_nodes(1)[0]
    run = Run.objects.create(cluster=node.cluster, name="r")
    for days in (8, 6):
        samples_put(node, time.time() - days * DAY, 30)
        steps_put(run, node, time.time() - days * DAY, 30, ranks=2)
    rollup_rows_put([400, 91, 89, 8, 6])

    deleted = history_prune(now=timezone.now())

    assert ages("telemetry_chunk", "t1") == [5]  # stored 6 days ago less 30 s
    assert ages("runs_stepreport", "ts") == [5]
    assert ages("history_sample_1m") == ages("history_step_1m") == [6, 8, 89]
    assert ages("history_runstep_1m") == [6, 8, 89]
    assert ages("history_step_10s") == ages("history_runstep_10s") == [6]
    assert ages("history_step_10m") == [6, 8, 89, 91]
    assert ages("history_sample_1h") == ages("history_step_1h") == [6, 8, 89, 91]
    assert ages("history_runstep_1h") == [6, 8, 89, 91]
    assert deleted == {
        "telemetry_chunk": 6,  # 3 batches of 2 GPUs
        "runs_stepreport": 60,
        "runs_stepchunk": 0,  # none compacted here (tests/runs/test_step_chunks.py prunes them)
        "history_sample_1m": 2,
        "history_step_10s": 4,  # 8, 89, 91 and 400 days old: over 7.5 days
        "history_runstep_10s": 4,
        "history_step_1m": 2,
        "history_runstep_1m": 2,
        "history_step_10m": 1,
        "history_sample_1h": 1,
        "history_step_1h": 1,
        "history_runstep_1h": 1,
    }


def test_it_keeps_a_resolution_forever_when_its_retention_is_zero(settings):
    settings.HISTORY_1H_RETENTION_DAYS = 0
    settings.HISTORY_RAW_RETENTION_DAYS = 0
    node = cluster_nodes(1)[0]
    samples_put(node, time.time() - 30 * DAY, 30)
    rollup_rows_put([4000])

    deleted = history_prune(now=timezone.now())

    assert "history_sample_1h" not in deleted and "telemetry_chunk" not in deleted
    assert ages("history_sample_1h") == [4000]
    assert ages("history_sample_1m") == []
    assert len(ages("telemetry_chunk", "t1")) == 1


def test_it_deletes_in_bounded_batches(settings):
    settings.HISTORY_PRUNE_BATCH = 4
    settings.HISTORY_PRUNE_MAX_BATCHES = 2
    node = cluster_nodes(1)[0]
    run = Run.objects.create(cluster=node.cluster, name="r")
    steps_put(run, node, time.time() - 8 * DAY, 10, ranks=2)  # 20 expired reports

    assert history_prune(now=timezone.now())["runs_stepreport"] == 8
    assert history_prune(now=timezone.now())["runs_stepreport"] == 8
    assert history_prune(now=timezone.now())["runs_stepreport"] == 4
    assert rows("SELECT count(*) FROM runs_stepreport")[0][0] == 0
