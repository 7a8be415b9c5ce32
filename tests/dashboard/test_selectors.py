"""The dashboard's own reads: the heat-map over narrow and wide ranges, the run's span."""

import time

import pytest

from apps.dashboard.selectors.ranges import time_range
from apps.dashboard.selectors.runs import nan_to_none, rank_busy_matrix, run_began, run_span
from apps.runs.models import Run
from tests.dashboard.conftest import RUN

pytestmark = pytest.mark.django_db


def test_the_heatmap_keeps_only_buckets_with_reports_at_any_range(cluster):
    run = Run.objects.get(cluster=cluster, name=RUN)
    now = time.time()
    narrow = rank_busy_matrix(run=run, start=now - 60, end=now + 1)
    assert narrow["resolution_s"] == 1 and 9 <= len(narrow["ts"]) <= 11  # 10 one-second steps
    week = rank_busy_matrix(run=run, start=now - 7 * 86400, end=now + 1)
    assert week["resolution_s"] == 7200 and len(week["ts"]) == 1  # not 84 empty columns
    assert week["ranks"] == narrow["ranks"] == list(range(8))
    cells = [value for row in nan_to_none(week["z"]) for value in row if value is not None]
    assert cells and all(value == pytest.approx(0.64) for value in cells)


def test_the_run_span_is_the_part_of_the_range_with_steps(cluster):
    run = Run.objects.get(cluster=cluster, name=RUN)
    now = time.time()
    began = run_began(run)
    assert now - 11 < began < now - 8  # the first of 10 one-second steps
    day = time_range(key="24h", now=now, began=began)
    start, end = run_span(run=run, tr=day, began=began)
    assert start == began and end == pytest.approx(run.last_step_at.timestamp() + 1)
    whole = time_range(key="all", now=now, began=began)
    assert whole.start == pytest.approx(now - 60)  # at least a minute, even for a new run
