"""The heat-map's read: every rank's busy time as a matrix, the very means of
run_rank_history's `busy`, from raw reports and from each rollup tier, in two queries."""

import numpy as np
import pytest

from apps.clusters.models import Node
from apps.history.selectors import run_rank_busy, run_rank_history
from apps.runs.models import Run
from launcher.plans import prepared_generic_plans
from tests.history.helpers import cluster_nodes, refresh, rows, settled_hour, steps_put

pytestmark = pytest.mark.django_db

HOUR = 3600


@pytest.fixture
def gappy_run():
    """5 ranks, one step a second for 2 hours, rank 2 slow; rank 3 silent in the first hour
    and rank 4 in the last, so that the matrix has holes where run_rank_history has None."""
    node: Node = cluster_nodes(1)[0]
    run = Run.objects.create(cluster=node.cluster, name="r", world_size=5)
    end = settled_hour()
    steps_put(run, node, end - 2 * HOUR, 2 * HOUR, ranks=5, slow_rank=2)
    rows(
        "DELETE FROM runs_stepreport WHERE run_id = %s AND ((rank = 3 AND ts < to_timestamp(%s))"
        " OR (rank = 4 AND ts >= to_timestamp(%s)))",
        [run.id, end - HOUR, end - HOUR],
    )
    refresh()
    return run, end


@pytest.mark.parametrize(
    ("span", "max_points", "resolution"),
    [(600, 1000, 1), (2 * HOUR, 1000, 10), (2 * HOUR, 120, 60), (2 * HOUR, 60, 120),
     (24 * HOUR, 120, 1200)],
)  # fmt: skip
def test_the_busy_matrix_holds_the_rank_history_busy_means(
    gappy_run, span, max_points, resolution, django_assert_num_queries
):
    run, end = gappy_run
    args = {"run_id": run.id, "start": end - span, "end": end, "max_points": max_points}
    history = run_rank_history(**args)
    with django_assert_num_queries(2):  # watermark and world size, then the cells
        busy = run_rank_busy(**args)
    assert busy.resolution_s == history.resolution_s == resolution
    assert (busy.ts, busy.ranks) == (history.ts, history.ranks)
    assert busy.reported.tolist() == [[v is not None for v in row] for row in history.busy]
    assert np.where(busy.reported, busy.busy, None).tolist() == history.busy
    if span > HOUR:  # the silent hours are holes, not zeros (the last 10 minutes lack rank 4)
        assert busy.ranks == [0, 1, 2, 3, 4] and not busy.reported.all()


def test_many_ranks_read_a_coarser_tier_whose_cells_are_its_rollup_aggregates():
    """The tier is chosen by the run's world size (ranks × buckets against
    RANK_ROLLUP_ROW_BUDGET): an hour of 1,024 ranks reads one-minute rows, not 368 k
    ten-second ones, and each cell is its minute row's busy_sum ÷ n, in the heat-map's read
    and in run_rank_history alike. A few ranks report, so the test stays small."""
    node: Node = cluster_nodes(1)[0]
    run = Run.objects.create(cluster=node.cluster, name="wide", world_size=256)
    end = settled_hour()
    steps_put(run, node, end - HOUR, HOUR, ranks=3, slow_rank=1)
    refresh()
    # minute rows that no ten-second tier could give: each its own mean
    rows(
        "UPDATE history_step_1m SET busy_sum = busy_sum * (rank + 1)"
        " + date_part('minute', bucket) * n / 100 WHERE run_id = %s",
        [run.id],
    )
    args = {"run_id": run.id, "start": end - HOUR, "end": end, "max_points": 120}
    assert run_rank_busy(**args).resolution_s == 30  # 256 ranks: the 10-second tier
    Run.objects.filter(id=run.id).update(world_size=1024)
    busy, history = run_rank_busy(**args), run_rank_history(**args)
    assert busy.resolution_s == history.resolution_s == 60 and len(busy.ts) == 60
    minutes = rows(
        "SELECT rank, floor(date_part('epoch', bucket) / 60)::int, busy_sum / n"
        " FROM history_step_1m WHERE run_id = %s ORDER BY 1, 2",
        [run.id],
    )
    first = int((end - HOUR) // 60)
    expected = np.full((3, 60), np.nan)
    for rank, minute, mean in minutes:
        expected[rank, minute - first] = mean
    rolled = 50  # the newest buckets may come from raw reports (after the last rollup pass)
    assert busy.ranks == [0, 1, 2]
    assert np.array_equal(busy.busy[:, :rolled], expected[:, :rolled])
    assert busy.busy[0, 0] != busy.busy[0, 1]  # the minutes differ: read from their rows
    assert np.where(busy.reported, busy.busy, None).tolist() == history.busy


def test_a_busy_matrix_without_reports_has_no_rows(gappy_run):
    run, end = gappy_run
    busy = run_rank_busy(run_id=run.id, start=end + HOUR, end=end + 2 * HOUR, max_points=120)
    assert busy.ranks == [] and busy.busy.shape == (0, len(busy.ts)) == (0, 120)


def test_a_non_finite_mean_is_a_hole_that_still_counts_as_reported(gappy_run):
    run, end = gappy_run
    rows(
        "UPDATE history_step_1m SET busy_sum = 'Infinity' WHERE run_id = %s AND rank = 0", [run.id]
    )
    busy = run_rank_busy(run_id=run.id, start=end - 2 * HOUR, end=end, max_points=60)
    assert busy.resolution_s == 120
    # the newest buckets may come from raw reports (after the last rollup pass, less a margin)
    assert busy.reported[0].all() and np.isinf(busy.busy[0][:50]).all()
    assert busy.busy[2].tolist() == [3.0] * 60


def test_a_rank_without_busy_times_keeps_its_row_empty(gappy_run):
    """Rollup rows written before busy times were rolled up hold none (null): such a cell is
    a hole, and a rank with only such cells keeps its (empty) row, as in run_rank_history."""
    run, end = gappy_run
    rows("UPDATE history_step_1m SET busy_sum = NULL WHERE run_id = %s AND rank = 1", [run.id])
    args = {"run_id": run.id, "start": end - 2 * HOUR, "end": end, "max_points": 60}
    history, busy = run_rank_history(**args), run_rank_busy(**args)
    assert busy.ranks == history.ranks == [0, 1, 2, 3, 4]
    assert not busy.reported[1][:50].any() and np.isnan(busy.busy[1][:50]).all()
    assert np.where(busy.reported, busy.busy, None).tolist() == history.busy


def test_it_answers_the_same_as_prepared_statements_with_generic_plans(gappy_run):
    """Bound server side and planned generically (see test_selectors), the lateral bucket
    ranges and the binary cells give the same matrix, run after run."""
    run, end = gappy_run
    calls = [
        {"run_id": run.id, "start": end - 600, "end": end},
        {"run_id": run.id, "start": end - 2 * HOUR, "end": end, "max_points": 60},
    ]
    expected = [run_rank_busy(**args) for args in calls]
    with prepared_generic_plans():
        for _ in range(10):
            for args, want in zip(calls, expected, strict=True):
                got = run_rank_busy(**args)
                assert (got.ts, got.ranks) == (want.ts, want.ranks)
                assert np.array_equal(got.busy, want.busy, equal_nan=True)
                assert np.array_equal(got.reported, want.reported)
        assert rows("SELECT count(*) FROM pg_prepared_statements")[0][0] >= len(calls)
