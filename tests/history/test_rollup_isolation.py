"""One bad bucket never stops the rollup pass: rows stored before the input bounds whose sums
overflow are set aside, every other series and run is rolled up and the watermark moves."""

import time

import pytest

from apps.history.services import rollups_refresh, runs_mark_dirty, series_mark_dirty
from apps.runs.models import Run
from apps.runs.services import steps_store
from apps.telemetry.services import samples_group, samples_store
from tests.history.helpers import cluster_nodes, expected_minutes, rows, samples_put, steps_put

pytestmark = pytest.mark.django_db

HUGE = 1.7e308  # finite; two of them sum past float8


def minute_start(minutes_ago: int) -> float:
    return (time.time() - minutes_ago * 60) // 60 * 60


def overflowing_samples(node, start: float) -> None:
    """Two huge samples in one minute, as an agent could send them before the bounds."""
    points = [{"ts": start + t, "metric": "gpu.util", "gpu": 0, "value": HUGE} for t in (1, 2)]
    stored = samples_store(series=samples_group(samples_by_node={node.id: points}))
    series_mark_dirty(ranges=stored.ranges)


def overflowing_steps(run, node, start: float) -> None:
    """Two reports whose tokens sum past bigint in one bucket."""
    report = {"rank": 0, "step": 1, "step_time": 1.0, "tokens": 2**62 + 1}
    stored = steps_store(steps=[(run.id, node.id, {**report, "ts": start + t}) for t in (1, 2)])
    runs_mark_dirty(ranges=stored.ranges)


def watermark() -> float | None:
    found = rows("SELECT extract(epoch FROM rolled_up_at)::float8 FROM history_watermark")
    return found[0][0] if found else None


def test_it_rolls_up_the_other_series_and_moves_the_watermark_past_an_overflowing_bucket():
    good, bad = cluster_nodes(2)
    start = minute_start(30)
    samples_put(good, start, 600, gpus=range(1))
    overflowing_samples(bad, start)
    samples_put(bad, start, 600, gpus=range(1, 2))  # the bad node's other GPU is fine
    before = time.time()

    result = rollups_refresh()

    assert result.drained and result.set_aside == 1
    assert watermark() >= before - 1
    minutes = rows(
        "SELECT node_id, gpu, count(*), sum(n) FROM history_sample_1m GROUP BY 1, 2 ORDER BY 1, 2"
    )
    assert minutes == [(good.id, 0, 10, 600), (bad.id, 1, 10, 600)]
    expected = expected_minutes(start, 600, 0)
    first = rows(
        "SELECT vsum FROM history_sample_1m WHERE node_id = %s ORDER BY bucket LIMIT 1", [good.id]
    )
    assert first[0][0] == pytest.approx(expected[start][1])
    assert rows("SELECT sum(n) FROM history_sample_1h WHERE node_id = %s", [good.id]) == [(600,)]
    assert not rows("SELECT 1 FROM history_dirty_series")


def test_it_rolls_up_the_other_runs_past_a_run_whose_sums_overflow():
    node = cluster_nodes(1)[0]
    good = Run.objects.create(cluster=node.cluster, name="good")
    bad = Run.objects.create(cluster=node.cluster, name="bad")
    start = minute_start(20)
    steps_put(good, node, start, 120, ranks=2)
    overflowing_steps(bad, node, start)
    before = time.time()

    result = rollups_refresh()

    assert result.drained and result.set_aside == 1
    assert watermark() >= before - 1
    per_run = rows("SELECT run_id, sum(n) FROM history_step_1m GROUP BY 1 ORDER BY 1")
    assert per_run == [(good.id, 240)]
    assert rows("SELECT sum(n) FROM history_runstep_1h WHERE run_id = %s", [good.id]) == [(240,)]
    assert not rows("SELECT 1 FROM history_dirty_run")


def test_a_later_pass_is_not_held_by_a_bucket_set_aside_before():
    good, bad = cluster_nodes(2)
    start = minute_start(40)
    overflowing_samples(bad, start)
    assert rollups_refresh().set_aside == 1

    samples_put(good, start + 60, 120, gpus=range(1))
    result = rollups_refresh()

    assert result.drained and result.set_aside == 0
    assert rows("SELECT sum(n) FROM history_sample_1m WHERE node_id = %s", [good.id]) == [(120,)]
