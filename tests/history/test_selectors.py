"""History selectors: resolution, point bounds, rollup vs raw, freshness, query counts."""

import time

import pytest

from apps.clusters.models import Node
from apps.history.selectors import (
    Resolution,
    metric_history,
    resolution_choose,
    run_rank_history,
    run_step_history,
)
from apps.history.selectors.metrics import metric_history_at
from apps.history.selectors.resolution import (
    RANK_ROLLUP_ROW_BUDGET,
    RUN_STEP_TIERS,
    STEP_TIERS,
)
from apps.runs.models import Run
from launcher.plans import prepared_generic_plans
from tests.history.helpers import (
    cluster_nodes,
    expected_minutes,
    refresh,
    rows,
    samples_put,
    settled_hour,
    steps_put,
    value_at,
)

pytestmark = pytest.mark.django_db

HOUR, DAY = 3600, 86400
NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("span", "age", "step", "source"),
    [
        (900, 0, 0, "raw"),
        (HOUR, 0, 5, "raw"),
        (6 * HOUR, 0, 30, "raw"),
        (24 * HOUR, 0, 120, "1m"),
        (72 * HOUR, 0, 300, "1m"),
        (30 * DAY, 0, 3600, "1h"),
        (HOUR, 8 * DAY, 60, "1m"),  # raw data of 8 days ago is gone (7-day retention)
        (HOUR, 91 * DAY, 3600, "1h"),  # so are its minutes (90 days)
    ],
)
def test_it_picks_the_finest_resolution_within_max_points(span, age, step, source):
    start = NOW - age - span
    res = resolution_choose(start=start, end=start + span, max_points=1000, now=NOW)
    assert res == Resolution(step=step, source=source)


@pytest.mark.parametrize(
    ("series", "span", "step", "source"),
    [
        (256, 900, 0, "raw"),  # 230 k raw points: within the budget
        (256, HOUR, 60, "1m"),  # 920 k: over, so the 1-minute rollup (60 buckets)
        (8, 6 * HOUR, 30, "raw"),
        (256, 6 * HOUR, 60, "1m"),
        (256, 72 * HOUR, 3600, "1h"),  # 1.1 M minute rows: over the budget too
    ],
)
def test_it_keeps_wide_requests_within_the_raw_point_budget(series, span, step, source):
    res = resolution_choose(start=NOW - span, end=NOW, max_points=1000, now=NOW, series=series)
    assert res == Resolution(step=step, source=source)


def test_run_level_reads_choose_among_the_run_level_tiers():
    # no 10-minute table for the run as a whole: 20-minute buckets come from its minutes
    res = resolution_choose(
        start=NOW - 24 * HOUR, end=NOW, max_points=120, now=NOW, raw_points=False,
        series=256, tiers=RUN_STEP_TIERS,
    )  # fmt: skip
    assert res == Resolution(step=1200, source="1m")


def test_a_tier_over_the_row_budget_gives_way_to_a_coarser_one():
    # 6 hours of 256 ranks at 30 s would read 553 k ten-second rows
    res = resolution_choose(
        start=NOW - 6 * HOUR, end=NOW, max_points=1000, now=NOW, raw_points=False, series=256,
        tiers=STEP_TIERS,
    )  # fmt: skip
    assert res == Resolution(step=60, source="1m")


@pytest.mark.parametrize(
    ("series", "span", "step", "source"),
    [
        (256, HOUR, 30, "10s"),  # 92 k ten-second rows: within the budget
        (400, HOUR, 30, "10s"),  # 144 k
        (1024, HOUR, 60, "1m"),  # 368 k: over, so one-minute columns (61 k rows)
        (256, 6 * HOUR, 300, "1m"),  # 92 k minute rows
        (1024, 6 * HOUR, 600, "10m"),  # 368 k: over, so ten-minute columns
        (1024, 24 * HOUR, 1200, "10m"),  # 147 k: within
    ],
)
def test_per_rank_reads_keep_within_the_rollup_row_budget(series, span, step, source):
    res = resolution_choose(
        start=NOW - span, end=NOW, max_points=120, now=NOW, raw_points=False, series=series,
        tiers=STEP_TIERS, row_budget=RANK_ROLLUP_ROW_BUDGET,
    )  # fmt: skip
    assert res == Resolution(step=step, source=source)


def test_the_rollup_row_budget_leaves_the_raw_fallback_to_the_raw_point_budget():
    # 10-second rows are gone after 2 days, raw data after 7: 15 minutes of 300 ranks are
    # 270 k raw reports, over the rollup row budget but within the raw one
    start = NOW - 3 * DAY - 900
    res = resolution_choose(
        start=start, end=start + 900, max_points=120, now=NOW, raw_points=False, series=300,
        tiers=STEP_TIERS, row_budget=RANK_ROLLUP_ROW_BUDGET,
    )  # fmt: skip
    assert res == Resolution(step=10, source="raw")


@pytest.mark.parametrize(
    ("span", "age", "step", "source"),
    [
        (900, 0, 10, "10s"),  # 15 minutes in 90 columns: from the 10-second tier
        (HOUR, 0, 30, "10s"),
        (900, 3 * DAY, 10, "raw"),  # 10-second buckets are kept 2 days, raw data 7
        (24 * HOUR, 0, 1200, "10m"),  # a day in 120 columns: from the 10-minute tier
        (72 * HOUR, 0, 3600, "1h"),
        (6 * HOUR, 0, 300, "1m"),  # 5 minutes is no multiple of 10
        (6 * HOUR, 91 * DAY, 600, "10m"),  # its minutes are gone: the next tier's width
        (6 * HOUR, 500 * DAY, 3600, "1h"),  # and its 10 minutes (400 days)
    ],
)
def test_step_reads_use_the_coarsest_tier_that_divides_the_bucket(span, age, step, source):
    start = NOW - age - span
    res = resolution_choose(
        start=start, end=start + span, max_points=120, now=NOW, raw_points=False, series=256,
        tiers=STEP_TIERS,
    )  # fmt: skip
    assert res == Resolution(step=step, source=source)


@pytest.fixture
def node():
    return cluster_nodes(1)[0]


def test_it_bounds_the_points_of_every_series(node):
    end = time.time() // 60 * 60
    samples_put(node, end - 3 * HOUR, 3 * HOUR, gpus=range(2))
    refresh()
    for span, max_points, resolution in [(900, 1000, 0), (HOUR, 100, 60), (3 * HOUR, 50, 300)]:
        history = metric_history(
            node_ids=[node.id], metric="gpu.util", gpu="all", start=end - span, end=end,
            max_points=max_points,
        )  # fmt: skip
        assert history.resolution_s == resolution
        assert [s.gpu for s in history.series] == [0, 1]
        for series in history.series:
            assert max_points // 2 < len(series.ts) <= max_points
            assert len(series.avg) == len(series.min) == len(series.max) == len(series.ts)


def test_it_returns_raw_points_for_a_short_range(node):
    start = time.time() // 60 * 60 - 1200
    samples_put(node, start, 600, gpus=range(-1, 1))
    history = metric_history(
        node_ids=[node.id], metric="gpu.util", gpu=None, start=start + 10, end=start + 20
    )
    (host,) = history.series
    assert (history.resolution_s, host.gpu) == (0, None)
    assert host.ts == [start + t for t in range(10, 20)]
    assert host.avg == host.min == host.max == [value_at(start + t, -1) for t in range(10, 20)]


def test_it_serves_the_same_buckets_from_the_rollup_as_from_raw(node):
    start = time.time() // 3600 * 3600 - 4 * HOUR
    samples_put(node, start, 2 * HOUR, gpus=range(1))
    refresh()
    args = {"node_ids": [node.id], "metric": "gpu.util", "gpu": 0}
    args |= {"start": start, "end": start + 2 * HOUR}
    from_raw = metric_history_at(**args, res=Resolution(step=300, source="raw"))
    from_rollup = metric_history_at(**args, res=Resolution(step=300, source="1m"))
    from_hours = metric_history_at(**args, res=Resolution(step=3600, source="1h"))
    raw, rolled = from_raw.series[0], from_rollup.series[0]
    assert len(raw.ts) == 24 and rolled.ts == raw.ts
    assert rolled.avg == pytest.approx(raw.avg) and (rolled.min, rolled.max) == (raw.min, raw.max)
    expected = expected_minutes(start, HOUR, 0)
    assert from_hours.series[0].avg[0] == pytest.approx(sum(v[1] for v in expected.values()) / HOUR)
    # and it really is the rollup that answered
    rows("UPDATE history_sample_1m SET vmax = 1000 WHERE node_id = %s", [node.id])
    spoiled = metric_history_at(**args, res=Resolution(step=300, source="1m"))
    assert spoiled.series[0].max == [1000.0] * 24


def test_it_reads_what_the_rollup_has_not_covered_yet_from_raw(node):
    end = time.time() // 600 * 600
    samples_put(node, end - 2 * HOUR, HOUR, gpus=range(1))
    refresh()
    # as if the last rollup pass ran an hour ago (the beat stalled), and data kept coming
    rows("UPDATE history_watermark SET rolled_up_at = to_timestamp(%s)", [end - HOUR])
    samples_put(node, end - HOUR, HOUR, gpus=range(1))
    history = metric_history(
        node_ids=[node.id], metric="gpu.util", gpu=0, start=end - 2 * HOUR, end=end,
        max_points=100,
    )  # fmt: skip
    series = history.series[0]
    assert (history.resolution_s, len(series.ts)) == (120, 60)
    assert series.ts[-1] == end - 120
    expected = expected_minutes(end - 2 * HOUR, 2 * HOUR, 0)
    last = [expected[end - 120], expected[end - 60]]
    assert series.avg[-1] == pytest.approx(sum(b[1] for b in last) / 120)


def test_it_reads_one_gpu_the_host_or_every_gpu_of_each_node():
    nodes = cluster_nodes(2)
    start = time.time() // 60 * 60 - 600
    samples_put(nodes[0], start, 60, gpus=range(-1, 3))
    samples_put(nodes[1], start, 60, gpus=range(-1, 2))
    ids = [nodes[1].id, nodes[0].id]
    args = {"metric": "gpu.util", "start": start, "end": start + 60}

    every = metric_history(node_ids=ids, gpu="all", **args).series
    assert [(s.node, s.gpu) for s in every] == [
        ("n00", 0), ("n00", 1), ("n00", 2), ("n01", 0), ("n01", 1)
    ]  # fmt: skip
    assert every[2].avg == [value_at(start + t, 2) for t in range(60)]
    one = metric_history(node_ids=ids, gpu=1, **args).series
    assert [(s.node, s.gpu, len(s.ts)) for s in one] == [("n00", 1, 60), ("n01", 1, 60)]
    host = metric_history(node_ids=ids, gpu=None, **args).series
    assert [(s.node, s.gpu, s.avg[0]) for s in host] == [
        ("n00", None, value_at(start, -1)), ("n01", None, value_at(start, -1))
    ]  # fmt: skip


@pytest.mark.parametrize("node_count", [1, 4])
def test_it_costs_the_same_queries_whatever_the_node_count(node_count, django_assert_num_queries):
    nodes = cluster_nodes(node_count)
    end = time.time() // 60 * 60
    for node in nodes:
        samples_put(node, end - 2 * HOUR, 2 * HOUR, gpus=range(2))
    refresh()
    ids = [node.id for node in nodes]
    with django_assert_num_queries(2):  # watermark and series count, then the series
        metric_history(node_ids=ids, metric="gpu.util", gpu="all", start=end - 900, end=end)
    with django_assert_num_queries(2):
        history = metric_history(
            node_ids=ids, metric="gpu.util", gpu="all", start=end - 2 * HOUR, end=end,
            max_points=100,
        )  # fmt: skip
    assert len(history.series) == 2 * node_count and history.resolution_s == 120


@pytest.fixture
def slow_run(node):
    """4 ranks, one step a second for 2 hours; rank 2 takes 3 s a step, the others 1 s."""
    run = Run.objects.create(cluster=node.cluster, name="r", world_size=4)
    end = settled_hour()
    steps_put(run, node, end - 2 * HOUR, 2 * HOUR, ranks=4, slow_rank=2)
    refresh()
    return run, end


@pytest.mark.parametrize(("span", "step"), [(900, 1), (HOUR, 5), (2 * HOUR, 10)])
def test_it_shows_a_slow_rank_in_the_step_matrix(slow_run, span, step):
    run, end = slow_run
    history = run_step_history(run_id=run.id, start=end - span, end=end)
    ranks = run_rank_history(run_id=run.id, start=end - span, end=end)
    buckets = span // step
    assert (ranks.resolution_s, len(ranks.ts), ranks.ranks) == (step, buckets, [0, 1, 2, 3])
    assert (history.resolution_s, history.ts) == (step, ranks.ts)
    assert ranks.step_time[2] == [3.0] * buckets
    assert ranks.step_time[0] == ranks.step_time[1] == ranks.step_time[3] == [1.0] * buckets
    # less collective wait: the slow rank works 3 s, the others 0.75 s and wait the rest
    assert ranks.busy[2] == [3.0] * buckets and ranks.busy[0] == [0.75] * buckets
    assert history.stages["comm_wait"] == pytest.approx([3 * 0.25 / 4] * buckets)
    assert history.stages["data_time"] == pytest.approx([0.1] * buckets)
    assert history.steps_per_s == pytest.approx([1.0] * buckets)
    assert history.tokens_per_s == pytest.approx([4000.0] * buckets)
    assert ranks.to_dict()["ranks"] == [0, 1, 2, 3]


def test_it_builds_the_step_matrix_from_the_rollup(slow_run, django_assert_num_queries):
    run, end = slow_run
    with django_assert_num_queries(2):
        ranks = run_rank_history(run_id=run.id, start=end - 2 * HOUR, end=end, max_points=60)
    assert (ranks.resolution_s, len(ranks.ts)) == (120, 60)
    assert ranks.step_time[2] == [3.0] * 60 and ranks.busy[1] == [0.75] * 60
    rows("UPDATE history_step_1m SET step_time_sum = 0 WHERE run_id = %s", [run.id])
    spoiled = run_rank_history(run_id=run.id, start=end - 2 * HOUR, end=end, max_points=60)
    assert spoiled.step_time[2] == [0.0] * 60  # it was the rollup that answered


def test_it_builds_the_run_history_from_the_run_level_rollup(slow_run, django_assert_num_queries):
    run, end = slow_run
    with django_assert_num_queries(2):
        history = run_step_history(run_id=run.id, start=end - 2 * HOUR, end=end, max_points=60)
    assert (history.resolution_s, len(history.ts)) == (120, 60)
    assert history.loss == pytest.approx([2.45] * 60)  # 2.0 + mean of 0.0 … 0.9
    assert history.steps_per_s == pytest.approx([1.0] * 60)
    assert history.tokens_per_s == pytest.approx([4000.0] * 60)
    rows("UPDATE history_runstep_1m SET tokens_sum = 0 WHERE run_id = %s", [run.id])
    spoiled = run_step_history(run_id=run.id, start=end - 2 * HOUR, end=end, max_points=60)
    assert spoiled.tokens_per_s == [0.0] * 60  # it was the run-level rollup that answered


def test_it_reads_a_day_of_ranks_from_the_ten_minute_tier(slow_run):
    run, end = slow_run
    ranks = run_rank_history(run_id=run.id, start=end - 24 * HOUR, end=end, max_points=120)
    assert ranks.resolution_s == 1200  # 20-minute buckets: two 10-minute rows each
    assert ranks.step_time[2][-6:] == [3.0] * 6 and ranks.busy[0][-6:] == [0.75] * 6
    rows("UPDATE history_step_10m SET busy_sum = 0 WHERE run_id = %s AND rank = 0", [run.id])
    spoiled = run_rank_history(run_id=run.id, start=end - 24 * HOUR, end=end, max_points=120)
    assert spoiled.busy[0][-6:] == [0.0] * 6


def test_it_answers_a_raw_step_history_in_two_queries(slow_run, django_assert_num_queries):
    run, end = slow_run
    with django_assert_num_queries(2):
        ranks = run_rank_history(run_id=run.id, start=end - 600, end=end)
    assert len(ranks.step_time) == 4 and len(ranks.step_time[0]) == 600
    with django_assert_num_queries(2):
        history = run_step_history(run_id=run.id, start=end - 600, end=end)
    assert len(history.ts) == 600 and history.steps_per_s == pytest.approx([1.0] * 600)


def test_it_gives_the_same_answers_as_prepared_statements_with_generic_plans(slow_run):
    """psycopg prepares a statement after prepare_threshold runs and Postgres may then plan
    it generically: the SQL must bind server side and answer the same, run after run."""
    run, end = slow_run
    node = Node.objects.get()
    samples_put(node, end - 2 * HOUR, 2 * HOUR, gpus=range(2))
    refresh()
    calls = [
        lambda: metric_history(node_ids=[node.id], metric="gpu.util", gpu="all",
                               start=end - 900, end=end),
        lambda: metric_history(node_ids=[node.id], metric="gpu.util", gpu=1,
                               start=end - 2 * HOUR, end=end, max_points=100),
        lambda: run_step_history(run_id=run.id, start=end - 600, end=end),
        lambda: run_step_history(run_id=run.id, start=end - 2 * HOUR, end=end, max_points=60),
        lambda: run_rank_history(run_id=run.id, start=end - 600, end=end),
        lambda: run_rank_history(run_id=run.id, start=end - 2 * HOUR, end=end, max_points=60),
    ]  # fmt: skip
    expected = [call() for call in calls]
    with prepared_generic_plans():
        for _ in range(10):
            assert [call() for call in calls] == expected
        assert rows("SELECT count(*) FROM pg_prepared_statements")[0][0] >= len(calls)
