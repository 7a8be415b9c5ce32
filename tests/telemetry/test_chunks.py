"""Sample chunks on real Postgres: what reads return, before and after compaction."""

import time
from datetime import UTC, datetime

import pytest
from django.db import connection

from apps.clusters.models import Cluster, Node
from apps.telemetry.selectors import (
    _SPANS_SQL,
    chunk_storage,
    metric_id_get,
    series_read,
    span_points,
)
from apps.telemetry.services import chunks_compact, samples_group, samples_store

pytestmark = pytest.mark.django_db

WIDTH = 600  # TELEMETRY_CHUNK_SECONDS


@pytest.fixture
def node():
    return Node.objects.create(cluster=Cluster.objects.create(name="c"), name="n")


def store_batches(node, start: float, batches: int, per_batch: int, gpus: int = 2) -> None:
    """`batches` batches of `per_batch` seconds each: gpu.util = seconds since start % 100."""
    for batch in range(batches):
        samples = [
            {"ts": start + t, "metric": "gpu.util", "gpu": gpu, "value": float(t % 100)}
            for t in range(batch * per_batch, (batch + 1) * per_batch)
            for gpu in range(gpus)
        ]
        samples_store(series=samples_group(samples_by_node={node.id: samples}))


def test_raw_reads_return_every_point_in_order_within_the_range(node):
    start = (time.time() - 7200) // WIDTH * WIDTH
    store_batches(node, start, batches=6, per_batch=10)
    metric = metric_id_get(name="gpu.util")
    points = series_read(node_id=node.id, metric_id=metric, gpu=1, start=start + 5, end=start + 25)
    assert [p[0] - start for p in points] == list(range(5, 25))
    assert [p[1] for p in points] == [float(t) for t in range(5, 25)]


def test_bucketed_reads_give_avg_min_max_count(node):
    start = (time.time() - 7200) // WIDTH * WIDTH
    store_batches(node, start, batches=12, per_batch=10)  # 120 s
    metric = metric_id_get(name="gpu.util")
    buckets = series_read(
        node_id=node.id, metric_id=metric, gpu=0, start=start, end=start + 120, step=60
    )
    second = (sum(range(60, 100)) + sum(range(0, 20))) / 60
    assert buckets == [
        [start, 29.5, 0.0, 59.0, 60],
        [start + 60, pytest.approx(second), 0.0, 99.0, 60],
    ]


def test_compaction_merges_a_window_into_one_chunk_per_series_and_keeps_every_point(node):
    start = (time.time() - 3 * 3600) // WIDTH * WIDTH
    store_batches(node, start, batches=60, per_batch=10)  # exactly one 10-minute window
    metric = metric_id_get(name="gpu.util")
    before = series_read(node_id=node.id, metric_id=metric, gpu=0, start=start, end=start + WIDTH)
    buckets_before = series_read(
        node_id=node.id, metric_id=metric, gpu=0, start=start, end=start + WIDTH, step=300
    )
    assert chunk_storage()["rows"] == 120 and chunk_storage()["samples"] == 1200

    chunks_compact(now=datetime.now(tz=UTC), lookback_windows=30)

    assert chunk_storage()["rows"] == 2  # one sealed chunk per GPU series
    assert chunk_storage()["samples"] == 1200
    assert (
        series_read(node_id=node.id, metric_id=metric, gpu=0, start=start, end=start + WIDTH)
        == before
    )
    assert (
        series_read(
            node_id=node.id, metric_id=metric, gpu=0, start=start, end=start + WIDTH, step=300
        )
        == buckets_before
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT bool_and(sealed), min(n), max(n) FROM telemetry_chunk")
        assert cursor.fetchone() == (True, 600, 600)


def test_compaction_splits_a_batch_that_straddles_two_windows(node):
    start = (time.time() - 3 * 3600) // WIDTH * WIDTH + WIDTH - 5
    store_batches(node, start, batches=1, per_batch=10, gpus=1)  # 5 s in each window
    chunks_compact(now=datetime.now(tz=UTC), lookback_windows=30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT n, sealed FROM telemetry_chunk ORDER BY t0")
        rows = cursor.fetchall()
    assert [n for n, _ in rows] == [5, 5]
    metric = metric_id_get(name="gpu.util")
    assert (
        len(series_read(node_id=node.id, metric_id=metric, gpu=0, start=start, end=start + 10))
        == 10
    )


def test_a_late_batch_is_merged_into_its_sealed_window(node):
    start = (time.time() - 3 * 3600) // WIDTH * WIDTH
    store_batches(node, start, batches=30, per_batch=10, gpus=1)
    chunks_compact(now=datetime.now(tz=UTC), lookback_windows=30)
    late = [
        {"ts": start + 400 + t, "metric": "gpu.util", "gpu": 0, "value": 1.0} for t in range(10)
    ]
    samples_store(series=samples_group(samples_by_node={node.id: late}))
    chunks_compact(now=datetime.now(tz=UTC), lookback_windows=30)
    assert chunk_storage() == {"bytes": chunk_storage()["bytes"], "samples": 310, "rows": 1}


def test_compaction_in_groups_of_few_points_gives_what_one_group_gives(node):
    """A window's series merged a group of about `points_batch` points at a time (here one
    series a statement: two would hold 1,200 points) come out as in one statement."""
    start = (time.time() - 3 * 3600) // WIDTH * WIDTH
    store_batches(node, start, batches=60, per_batch=10, gpus=4)  # 4 series × 600 points
    metric = metric_id_get(name="gpu.util")
    before = [
        series_read(node_id=node.id, metric_id=metric, gpu=gpu, start=start, end=start + WIDTH)
        for gpu in range(4)
    ]
    chunks_compact(now=datetime.now(tz=UTC), lookback_windows=30, points_batch=1_000)
    assert chunk_storage()["rows"] == 4 and chunk_storage()["samples"] == 2400
    after = [
        series_read(node_id=node.id, metric_id=metric, gpu=gpu, start=start, end=start + WIDTH)
        for gpu in range(4)
    ]
    assert after == before


def test_series_groups_keep_whole_series_within_the_points():
    from apps.telemetry.services import series_groups

    rows = [(1, 1, 0, 600), (1, 1, 1, 600), (1, 1, 2, 300), (1, 1, 3, 5000), (1, 1, 4, 1)]
    groups = list(series_groups(rows, points=1000))
    assert groups == [[(1, 1, 0)], [(1, 1, 1), (1, 1, 2)], [(1, 1, 3)], [(1, 1, 4)]]


def test_the_spans_read_gives_every_kind_of_chunk_each_from_its_own_index(node):
    """One-point raw chunks, raw chunks of more points and a sealed chunk: the spans read
    gives every point a series read gives (a one-point chunk's at its start, its value its
    vmin), and each branch scans its own partial (node, t1) index (migration 0006): one
    whose predicate the planner could not prove would leave a branch to the series index."""
    start = (time.time() - 3 * 3600) // WIDTH * WIDTH
    store_batches(node, start, batches=60, per_batch=10)  # a window, sealed below
    chunks_compact(now=datetime.now(tz=UTC), lookback_windows=30)
    store_batches(node, start + WIDTH, batches=3, per_batch=10)  # raw, 10 points each
    store_batches(node, start + WIDTH + 30, batches=20, per_batch=1)  # raw, one point each
    metric = metric_id_get(name="gpu.util")
    spans = {node.id: (start + WIDTH - 5, start + WIDTH + 50)}

    nodes, metrics, gpus, starts, ts, values = span_points(
        spans=spans, metric_ids=[metric]
    ).columns()

    assert set(nodes.tolist()) == {node.id} and set(metrics.tolist()) == {metric}
    for gpu in (0, 1):
        mine = gpus == gpu
        got = sorted(zip(ts[mine].tolist(), values[mine].tolist(), strict=True))
        got = [p for p in got if spans[node.id][0] <= p[0] < spans[node.id][1]]
        want = series_read(node_id=node.id, metric_id=metric, gpu=gpu, start=spans[node.id][0],
                           end=spans[node.id][1])  # fmt: skip
        assert got == [tuple(p) for p in want] and len(got) == 55
    assert starts.min() <= start + WIDTH - 5  # the sealed chunk came, whole

    assert spans_read_indexes(spans, metric) == [
        "telemetry_chunk_node_t1_point",
        "telemetry_chunk_node_t1_other",
        "telemetry_chunk_node_t1_other",
    ]


def spans_read_indexes(spans, metric) -> list[str]:
    """The parent index of each index the spans read's plan scans, in plan order, with the
    table's other indexes dropped (in this test's transaction, rolled back after it) and
    sequential scans off: on the test's few rows the planner may find the series index as
    cheap, and with only the partial indexes left a branch whose predicate it could not
    prove would scan the table."""
    params = {
        "nodes": list(spans),
        "starts": [a for a, _ in spans.values()],
        "end": max(b for _, b in spans.values()),
        "metrics": [metric],
    }
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX telemetry_chunk_series, telemetry_chunk_t0_brin")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {_SPANS_SQL}", params)
        plan = cursor.fetchone()[0]
        names = list(index_names(plan[0]["Plan"] if isinstance(plan, list) else plan))
        cursor.execute(
            "SELECT child.relname, parent.relname FROM pg_inherits"
            " JOIN pg_class child ON child.oid = inhrelid"
            " JOIN pg_class parent ON parent.oid = inhparent WHERE child.relname = ANY(%s)",
            [names],
        )
        parents = dict(cursor.fetchall())
    return [parents.get(name, name) for name in names]


def index_names(plan: dict):
    if "Index Name" in plan:
        yield plan["Index Name"]
    for child in plan.get("Plans", []):
        yield from index_names(child)
