"""Minute rollups from chunks of any shape: a chunk within one minute of its island counts with
its own n/sum/min/max, the others point by point (apps/history/services/sql.py). Whatever
the batches' boundaries, their order of arrival and the passes between them, every minute
holds what its raw points give."""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.history.services import rollups_refresh, series_mark_dirty
from apps.telemetry.services import samples_group, samples_store
from tests.history.helpers import cluster_nodes, rows

pytestmark = pytest.mark.django_db

BASE = (time.time() - 3600) // 3600 * 3600  # an hour ago, on the hour: within every floor
names = itertools.count()

# quarter seconds (exact in binary) over 5 minutes; a batch is a run of them
batch = st.lists(
    st.tuples(st.integers(0, 1199), st.floats(-1e6, 1e6, allow_nan=False)), min_size=1
).map(sorted)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(batch, min_size=1, max_size=8),
    passes=st.sets(st.integers(0, 7), max_size=3),
)
def test_every_minute_holds_what_its_points_give(batches, passes):
    node = cluster_nodes(1, name=f"minute-parts-{next(names)}")[0]
    expected: dict[float, list[float]] = defaultdict(list)
    for index, points in enumerate(batches):
        samples = [
            {"ts": BASE + quarter / 4, "metric": "gpu.util", "gpu": 0, "value": value}
            for quarter, value in points
        ]
        stored = samples_store(series=samples_group(samples_by_node={node.id: samples}))
        series_mark_dirty(ranges=stored.ranges)
        for quarter, value in points:
            expected[math.floor((BASE + quarter / 4) / 60) * 60].append(value)
        if index in passes:  # a pass between batches: later ones land in rolled-up minutes
            rollups_refresh()
    rollups_refresh()

    minutes = rows(
        "SELECT extract(epoch FROM bucket)::float8, n, vsum, vmin, vmax FROM history_sample_1m"
        " WHERE node_id = %s ORDER BY bucket",
        [node.id],
    )
    assert [m[0] for m in minutes] == sorted(expected)
    for bucket, n, vsum, vmin, vmax in minutes:
        values = expected[bucket]
        assert (n, vmin, vmax) == (len(values), min(values), max(values))
        assert vsum == pytest.approx(math.fsum(values), rel=1e-9, abs=1e-6)
    hours = rows("SELECT sum(n) FROM history_sample_1h WHERE node_id = %s", [node.id])
    assert hours == [(sum(len(values) for values in expected.values()),)]
