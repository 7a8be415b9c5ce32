"""Rollups on real Postgres: equal to raw aggregates, recomputed for late data, idempotent."""

import time
from datetime import UTC, datetime, timedelta

import pytest

from apps.history.services import rollups_rebuild
from apps.runs.models import Run
from apps.telemetry.services import chunks_compact
from tests.history.helpers import (
    cluster_nodes,
    expected_minutes,
    refresh,
    rows,
    samples_put,
    steps_put,
)

pytestmark = pytest.mark.django_db

MINUTES_SQL = (
    "SELECT extract(epoch FROM bucket)::float8, n, vsum, vmin, vmax FROM history_sample_1m"
    " WHERE node_id = %s AND gpu = %s ORDER BY bucket"
)
HOURS_SQL = MINUTES_SQL.replace("history_sample_1m", "history_sample_1h")


def hour_start(hours_ago: float) -> float:
    return (time.time() - hours_ago * 3600) // 3600 * 3600


def minutes_of(node, gpu: int) -> dict[float, tuple]:
    return {row[0]: tuple(row[1:]) for row in rows(MINUTES_SQL, [node.id, gpu])}


def assert_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for bucket, (n, total, low, high) in expected.items():
        assert actual[bucket] == (n, pytest.approx(total), low, high), bucket


def test_it_rolls_minutes_and_hours_up_to_the_raw_aggregates():
    node = cluster_nodes(1)[0]
    start = hour_start(3) + 30  # half a minute in: the first and last minutes are partial
    samples_put(node, start, 2 * 3600, gpus=range(-1, 2))
    refresh()
    for gpu in (-1, 0, 1):
        expected = expected_minutes(start, 2 * 3600, gpu)
        assert_close(minutes_of(node, gpu), expected)
        hours = {row[0]: tuple(row[1:]) for row in rows(HOURS_SQL, [node.id, gpu])}
        assert sorted(hours) == [start - 30, start - 30 + 3600, start - 30 + 7200]
        assert sum(h[0] for h in hours.values()) == 7200
        assert hours[start - 30][1] == pytest.approx(
            sum(v[1] for b, v in expected.items() if b < start - 30 + 3600)
        )


def test_chunks_within_a_minute_and_across_minutes_roll_up_alike():
    """A chunk whose points all lie in one minute is rolled up from its own n/sum/min/max,
    one that crosses a minute from its points: the buckets are the raw aggregates either way
    (10 s batches starting 55 s into a minute cross every other minute boundary)."""
    node = cluster_nodes(1)[0]
    start = hour_start(2) + 55
    samples_put(node, start, 600, gpus=range(1))
    refresh()
    assert_close(minutes_of(node, 0), expected_minutes(start, 600, 0))
    crossing = rows(
        "SELECT count(*) FILTER (WHERE date_trunc('minute', t0) <> date_trunc('minute', t1)),"
        " count(*) FROM telemetry_chunk WHERE node_id = %s",
        [node.id],
    )[0]
    assert 0 < crossing[0] < crossing[1], "both kinds of chunk are there"


def test_it_recomputes_the_buckets_that_late_data_lands_in():
    node = cluster_nodes(1)[0]
    start = hour_start(30)  # a day and more ago: an agent replaying its spool
    samples_put(node, start, 600, gpus=range(1))
    samples_put(node, start + 1200, 600, gpus=range(1))
    refresh()
    before = minutes_of(node, 0)
    assert len(before) == 20 and start + 600 not in before

    samples_put(node, start + 600, 600, gpus=range(1))  # the gap arrives late, out of order
    refresh()

    assert_close(minutes_of(node, 0), expected_minutes(start, 1800, 0))
    assert rows(HOURS_SQL, [node.id, 0])[0][1] == 1800


def test_it_does_not_double_count_when_rerun_or_rebuilt():
    node = cluster_nodes(1)[0]
    start = hour_start(2)
    samples_put(node, start, 900, gpus=range(2))
    refresh()
    first = minutes_of(node, 1), rows(HOURS_SQL, [node.id, 1])

    refresh()
    now = datetime.now(tz=UTC)
    rollups_rebuild(start=now - timedelta(hours=3), end=now, window=timedelta(minutes=7))
    rollups_rebuild(start=now - timedelta(hours=3), end=now, window=timedelta(hours=1))

    assert (minutes_of(node, 1), rows(HOURS_SQL, [node.id, 1])) == first
    assert first[1][0][1] == 900


def test_it_gives_the_same_rollups_after_compaction():
    node = cluster_nodes(1)[0]
    start = hour_start(3)
    samples_put(node, start, 1800, gpus=range(1))
    refresh()
    before = minutes_of(node, 0)
    chunks_compact(now=datetime.now(tz=UTC), lookback_windows=30)
    now = datetime.now(tz=UTC)
    rollups_rebuild(start=now - timedelta(hours=4), end=now, window=timedelta(hours=1))
    assert rows("SELECT count(*) FROM telemetry_chunk")[0][0] == 3  # one per 10 minutes
    assert minutes_of(node, 0) == before


def test_it_rolls_step_reports_up_per_rank_and_bucket():
    node = cluster_nodes(1)[0]
    run = Run.objects.create(cluster=node.cluster, name="r")
    start = hour_start(2) + 10
    steps_put(run, node, start, 120, ranks=3, slow_rank=1)
    refresh()
    minute = rows(
        "SELECT rank, n, max_step, step_time_sum, step_time_max, tokens_sum, loss_sum, loss_n,"
        " comm_wait_sum, comm_wait_n, busy_sum FROM history_step_1m WHERE run_id = %s"
        " AND bucket = to_timestamp(%s) ORDER BY rank",
        [run.id, start - 10 + 60],
    )
    losses = sum(2.0 + (t % 10) / 10 for t in range(50, 110))
    assert minute == [
        (0, 60, 109, pytest.approx(60.0), 1.0, 60_000, pytest.approx(losses), 60,
         pytest.approx(60 * 0.25), 60, pytest.approx(60 * 0.75)),
        (1, 60, 109, pytest.approx(180.0), 3.0, 60_000, pytest.approx(losses), 60,
         0.0, 60, pytest.approx(180.0)),
        (2, 60, 109, pytest.approx(60.0), 1.0, 60_000, pytest.approx(losses), 60,
         pytest.approx(60 * 0.25), 60, pytest.approx(60 * 0.75)),
    ]  # fmt: skip
    # the run as a whole: every rank's reports of the minute
    assert rows(
        "SELECT ranks, n, max_step, step_time_sum, tokens_sum, comm_wait_sum"
        " FROM history_runstep_1m WHERE run_id = %s AND bucket = to_timestamp(%s)",
        [run.id, start - 10 + 60],
    ) == [(3, 180, 109, pytest.approx(300.0), 180_000, pytest.approx(30.0))]
    ten_seconds = rows(
        "SELECT rank, n, step_time_sum, busy_sum FROM history_step_10s WHERE run_id = %s"
        " AND bucket = to_timestamp(%s) ORDER BY rank",
        [run.id, start - 10 + 60],
    )
    assert ten_seconds == [
        (0, 10, pytest.approx(10.0), pytest.approx(7.5)),
        (1, 10, pytest.approx(30.0), pytest.approx(30.0)),
        (2, 10, pytest.approx(10.0), pytest.approx(7.5)),
    ]
    assert rows(
        "SELECT count(*), min(ranks), sum(n) FROM history_runstep_10s WHERE run_id = %s", [run.id]
    ) == [(12, 3, 360)]  # two minutes of 10-second buckets, every report once
    hour = rows(
        "SELECT rank, n, max_step, step_time_max FROM history_step_1h WHERE run_id = %s"
        " ORDER BY rank",
        [run.id],
    )
    assert hour == [(0, 120, 119, 1.0), (1, 120, 119, 3.0), (2, 120, 119, 1.0)]
    tens = rows(
        "SELECT extract(epoch FROM bucket)::int - %s, rank, n, busy_sum FROM history_step_10m"
        " WHERE run_id = %s ORDER BY 1, 2",
        [start - 10, run.id],
    )
    assert tens == [
        (0, 0, 120, pytest.approx(90.0)),
        (0, 1, 120, pytest.approx(360.0)),
        (0, 2, 120, pytest.approx(90.0)),
    ]
    assert rows(
        "SELECT ranks, n, max_step, step_time_max FROM history_runstep_1h WHERE run_id = %s",
        [run.id],
    ) == [(3, 360, 119, 3.0)]
