"""The run as a whole reads its own tiers, one row per bucket: the row budget counts those
rows, not the run's ranks (raw reports still count one per rank per second)."""

import time

import pytest

from apps.history.selectors import Resolution, resolution_choose, run_step_history
from apps.history.selectors.resolution import RUN_STEP_TIERS
from apps.runs.models import Run
from tests.history.helpers import cluster_nodes

pytestmark = pytest.mark.django_db

HOUR = 3600
NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("span", "step", "source"),
    [(12 * HOUR, 120, "1m"), (24 * HOUR, 300, "1m"), (72 * HOUR, 600, "1m")],
)
def test_run_level_tiers_count_one_row_per_bucket_whatever_the_world_size(span, step, source):
    # 1,024 ranks × 12 hours of minutes would be 737 k rows, over the budget; the run-level
    # minute table holds 720 of them
    res = resolution_choose(
        start=NOW - span, end=NOW, max_points=600, now=NOW, raw_points=False, series=1024,
        tiers=RUN_STEP_TIERS, tier_series=1,
    )  # fmt: skip
    assert res == Resolution(step=step, source=source)


@pytest.mark.parametrize(("ranks", "step", "source"), [(1024, 60, "1m"), (8, 20, "raw")])
def test_the_raw_fallback_still_counts_every_rank(ranks, step, source):
    # 20-second buckets over 15 minutes divide no tier here: raw reports, unless the ranks
    # make them more than the raw-point budget (1,024 ranks: 921 k), widened to minutes then
    res = resolution_choose(
        start=NOW - 900, end=NOW, max_points=60, now=NOW, raw_points=False, series=ranks,
        tiers=("1m", "1h"), tier_series=1,
    )  # fmt: skip
    assert res == Resolution(step=step, source=source)


def test_a_long_range_of_many_ranks_keeps_minute_buckets_in_the_run_charts():
    node = cluster_nodes(1)[0]
    run = Run.objects.create(cluster=node.cluster, name="wide", world_size=1024)
    end = time.time()
    history = run_step_history(run_id=run.id, start=end - 12 * HOUR, end=end, max_points=600)
    assert history.resolution_s == 120  # not hour buckets, and an hour's reports read raw
