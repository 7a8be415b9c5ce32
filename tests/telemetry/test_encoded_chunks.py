"""Sealed chunks encoded with apps/core/codec.py: round trip, reads equal before and after
compaction, late data into a sealed window, rollups and pruning of encoded chunks."""

import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.db import connection
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from apps.clusters.models import Cluster, Node
from apps.core.codec import floats_decode, floats_encode, ints_decode, ints_encode
from apps.history.selectors.metrics import metric_history_at
from apps.history.selectors.resolution import Resolution
from apps.history.services import history_prune, rollups_refresh, series_mark_dirty
from apps.telemetry.selectors import chunk_storage, metric_id_get, series_points, series_read
from apps.telemetry.services import (
    COMPACT_GRACE_S,
    chunks_compact,
    samples_group,
    samples_store,
)

WIDTH = 600  # TELEMETRY_CHUNK_SECONDS

offsets_ms = st.lists(st.integers(min_value=0, max_value=WIDTH * 1000), max_size=700).map(sorted)
# GPU counters: a few repeated, quantised values, or any finite float within the bounds
values = st.lists(
    st.one_of(
        st.sampled_from([0.0, 0.5, 42.0, 99.99, -1.25, 1.5e9]),
        st.floats(min_value=-1e300, max_value=1e300, allow_nan=False),
    ),
    max_size=700,
)


@given(offsets=offsets_ms)
@hypothesis_settings(max_examples=200, deadline=None)
def test_it_round_trips_sorted_ms_offsets(offsets):
    decoded = ints_decode(ints_encode(offsets))
    assert decoded.dtype == np.int64 and decoded.tolist() == offsets


@given(vals=values)
@hypothesis_settings(max_examples=200, deadline=None)
def test_it_round_trips_floats_bit_for_bit(vals):
    decoded = floats_decode(floats_encode(vals))
    assert decoded.dtype == np.float64
    assert decoded.view(np.uint64).tolist() == np.asarray(vals, np.float64).view(np.uint64).tolist()


def test_it_round_trips_offsets_beyond_int32():
    assert ints_decode(ints_encode([0, 2**40, -(2**35)])).tolist() == [0, 2**40, -(2**35)]


@pytest.fixture
def node(db):
    return Node.objects.create(cluster=Cluster.objects.create(name="c"), name="n")


def store(node, points: list[tuple[float, float]], gpu: int = 0) -> None:
    samples = [{"ts": ts, "metric": "gpu.power", "gpu": gpu, "value": v} for ts, v in points]
    stored = samples_store(series=samples_group(samples_by_node={node.id: samples}))
    series_mark_dirty(ranges=stored.ranges)  # as the ingest store step does


def power(t: int) -> float:
    # quantised like an agent's watts, in quarters: sums are exact whatever their order
    return round(1000 + 160 * np.sin(t / 30)) / 4


def compact(now: datetime | None = None) -> None:
    chunks_compact(now=now or datetime.now(tz=UTC), lookback_windows=30)


def stored_rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n, sealed, ts_pco IS NOT NULL, vals_pco IS NOT NULL,"
            " cardinality(offsets_ms), cardinality(vals) FROM telemetry_chunk ORDER BY t0"
        )
        return cursor.fetchall()


def reads(node, start: float, end: float) -> dict:
    metric = metric_id_get(name="gpu.power")
    history = {
        step: metric_history_at(
            node_ids=[node.id],
            metric="gpu.power",
            gpu=0,
            start=start,
            end=end,
            res=Resolution(step=step, source="raw"),
            max_points=100_000,
        ).to_dict()["series"]
        for step in (0, 7, 60)
    }
    return {
        "raw": series_read(node_id=node.id, metric_id=metric, gpu=0, start=start, end=end),
        **{
            step: series_read(
                node_id=node.id, metric_id=metric, gpu=0, start=start, end=end, step=step
            )
            for step in (7, 60, 300)
        },
        "history": history,
        "window": series_points(node_ids=[node.id], metric_ids=[metric], start=start, end=end),
    }


def test_compaction_encodes_sealed_chunks_and_every_read_returns_the_same_points(node):
    start = (time.time() - 3 * 3600) // WIDTH * WIDTH
    for batch in range(70):  # 700 s: one whole window and 100 s of the next
        store(node, [(start + t + 0.25, power(t)) for t in range(batch * 10, batch * 10 + 10)])
    before = reads(node, start + 3, start + 690)
    assert len(before["raw"]) == 687

    compact()

    assert stored_rows() == [(600, True, True, True, 0, 0), (100, True, True, True, 0, 0)]
    assert reads(node, start + 3, start + 690) == before
    assert chunk_storage()["samples"] == 700
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(pg_column_size(ts_pco)), sum(pg_column_size(vals_pco)) FROM telemetry_chunk"
        )
        ts_bytes, vals_bytes = cursor.fetchone()
    assert ts_bytes < 100 and vals_bytes < 700  # the arrays held 4 + 8 B a point


def test_a_batch_past_the_window_end_stays_an_unsealed_array_chunk(node):
    # the last window finished at `now` ends here; one `now` for both, or a window boundary
    # crossed in between would seal the next window too
    now = datetime.now(tz=UTC)
    end = (int(now.timestamp()) - COMPACT_GRACE_S) // WIDTH * WIDTH
    store(node, [(end - 5 + t, float(t)) for t in range(10)])
    compact(now)
    assert stored_rows() == [(5, True, True, True, 0, 0), (5, False, False, False, 5, 5)]
    metric = metric_id_get(name="gpu.power")
    points = series_read(node_id=node.id, metric_id=metric, gpu=0, start=end - 5, end=end + 5)
    assert points == [[end - 5 + t, float(t)] for t in range(10)]


def test_late_data_into_a_sealed_window_is_merged_exactly_once(node):
    start = (time.time() - 3 * 3600) // WIDTH * WIDTH
    store(node, [(start + t, power(t)) for t in range(0, 600, 2)])  # even seconds
    compact()
    late = [(start + t, -1.0) for t in range(301, 311, 2)]  # 5 odd seconds, late
    store(node, late)
    compact()
    compact()  # a second pass finds nothing to merge

    assert stored_rows() == [(305, True, True, True, 0, 0)]
    metric = metric_id_get(name="gpu.power")
    points = series_read(node_id=node.id, metric_id=metric, gpu=0, start=start, end=start + WIDTH)
    assert [p[0] - start for p in points] == sorted([*range(0, 600, 2), *range(301, 311, 2)])
    assert [p for p in points if p[1] == -1.0] == [[ts, v] for ts, v in late]


def test_rollups_of_late_data_count_the_sealed_points_of_its_minutes(node):
    start = (time.time() - 3 * 3600) // WIDTH * WIDTH
    store(node, [(start + t, 2.0) for t in range(0, 600, 2)])
    rollups_refresh()
    compact()
    store(node, [(start + 61, 8.0), (start + 63, 8.0)])  # late, into minute 1 of the window
    rollups_refresh()

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM bucket)::int8 - %s, n, vsum, vmin, vmax"
            " FROM history_sample_1m WHERE bucket < to_timestamp(%s) ORDER BY bucket",
            [int(start), start + 180],
        )
        minutes = cursor.fetchall()
        cursor.execute("SELECT n, vsum FROM history_sample_1h ORDER BY bucket")
        hours = cursor.fetchall()
    assert minutes == [(0, 30, 60.0, 2.0, 2.0), (60, 32, 76.0, 2.0, 8.0), (120, 30, 60.0, 2.0, 2.0)]
    assert sum(n for n, _ in hours) == 302 and sum(vsum for _, vsum in hours) == 616.0


def test_pruning_removes_encoded_chunks_by_time(node, settings):
    now = time.time()
    old = (now - 9 * 86400) // WIDTH * WIDTH
    recent = (now - 3 * 3600) // WIDTH * WIDTH
    store(node, [(old + t, 1.0) for t in range(60)])
    store(node, [(recent + t, 1.0) for t in range(60)])
    chunks_compact(now=datetime.now(tz=UTC) - timedelta(days=9) + timedelta(hours=1))
    compact()
    assert [row[2] for row in stored_rows()] == [True, True]  # both encoded

    settings.HISTORY_RAW_RETENTION_DAYS = 7
    deleted = history_prune(now=datetime.now(tz=UTC))

    assert deleted["telemetry_chunk"] == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM t0)::float8 FROM telemetry_chunk")
        assert cursor.fetchall() == [(recent,)]
