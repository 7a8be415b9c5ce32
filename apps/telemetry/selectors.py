"""Reads of telemetry: one series as raw points or time-bucketed aggregates, and which
series a node has, grouped by the scrape target (source) they came from."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any, TypeVar

import numpy as np
import psycopg
from django.db import connections

from apps.core.db import query_logged
from apps.core.db_router import read_alias
from apps.core.partitions import relation_bytes_sql
from apps.telemetry.arrays import arrays_as_numpy
from apps.telemetry.blocks import SeriesBlocks, SpanPoints, chunk_arrays
from apps.telemetry.models import HOST_GPU, NodeHealth

# The agent stores every scraped series that is not a core contract metric as
# `<target>:<folded name>` (docs/agent.md), so the part before the first ':' names the
# scrape target when it is a target name; core and agent metrics (`gpu.util`) have none.
SOURCE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_SOURCE = re.compile(SOURCE_PATTERN)

# A raw (not yet compacted) chunk holds one batch, so it never starts long before its
# points; this bounds the index range scanned for a series.
MAX_CHUNK_SPAN = "1 day"

# The chunks of one series that may hold points in [start, end), in time order; a chunk lying
# inside one bucket (`whole`) leaves its points unread: its n/min/max/sum stand for them.
_CHUNKS_SQL = f"""
SELECT e0, n, vmin, vmax, vsum, whole,
       CASE WHEN whole THEN NULL ELSE offsets_ms END, CASE WHEN whole THEN NULL ELSE vals END,
       CASE WHEN whole THEN NULL ELSE ts_pco END, CASE WHEN whole THEN NULL ELSE vals_pco END
FROM (
    SELECT *, CASE WHEN %(step)s > 0 THEN floor(e0 / %(step)s) = floor(e1 / %(step)s)
                   AND e0 >= %(start)s AND e1 < %(end)s ELSE false END AS whole
    FROM (
        SELECT extract(epoch FROM t0)::float8 AS e0, extract(epoch FROM t1)::float8 AS e1,
               n, vmin, vmax, vsum, offsets_ms, vals, ts_pco, vals_pco
        FROM telemetry_chunk
        WHERE node_id = %(node)s AND metric_id = %(metric)s AND gpu = %(gpu)s
          AND t0 < to_timestamp(%(end)s)
          AND t0 >= to_timestamp(%(start)s) - interval '{MAX_CHUNK_SPAN}'
          AND t1 >= to_timestamp(%(start)s)
        ORDER BY t0
    ) c
) c
"""

MAX_POINTS = 100_000


def chunk_points(
    e0: float,
    offsets: list[int] | np.ndarray | None,
    vals: list[float] | np.ndarray | None,
    ts_pco: bytes | None = None,
    vals_pco: bytes | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(timestamps in epoch seconds, values) of one stored chunk starting at e0:
    `e0 + offset / 1000`, the same float the SQL reads of arrays compute."""
    offsets_ms, values = chunk_arrays(offsets, vals, ts_pco, vals_pco)
    return e0 + offsets_ms / 1000.0, values


def series_read(
    *, node_id: int, metric_id: int, gpu: int | None, start: float, end: float, step: float = 0
) -> list[list[float]]:
    """Points of one series in [start, end): `[[ts, value], …]` when step is 0, else
    `[[bucket start, avg, min, max, count], …]` per `step` seconds."""
    params = {
        "node": node_id,
        "metric": metric_id,
        "gpu": HOST_GPU if gpu is None else gpu,
        "start": start,
        "end": end,
        "step": step,
    }
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(_CHUNKS_SQL, params)
        rows = cursor.fetchall()
    parts = [chunk_points(row[0], *row[6:]) for row in rows if not row[5]]
    ts = np.concatenate([p[0] for p in parts]) if parts else np.empty(0)
    values = np.concatenate([p[1] for p in parts]) if parts else np.empty(0)
    inside = (ts >= start) & (ts < end)
    ts, values = ts[inside], values[inside]
    if not step:
        order = np.argsort(ts, kind="stable")[:MAX_POINTS]
        return np.column_stack([ts[order], values[order]]).tolist()
    whole = np.array([row[:5] for row in rows if row[5]], dtype=np.float64).reshape(-1, 5)
    return _buckets(whole=whole, ts=ts, values=values, step=step)


def _buckets(*, whole: np.ndarray, ts: np.ndarray, values: np.ndarray, step: float) -> list:
    """`[[bucket start, avg, min, max, count], …]` of whole chunks' (e0, n, min, max, sum)
    rows and of loose points."""
    starts = np.concatenate([np.floor(whole[:, 0] / step), np.floor(ts / step)]) * step
    counts = np.concatenate([whole[:, 1], np.ones(len(ts))])
    lows = np.concatenate([whole[:, 2], values])
    highs = np.concatenate([whole[:, 3], values])
    sums = np.concatenate([whole[:, 4], values])
    keys, inverse = np.unique(starts, return_inverse=True)
    n = np.bincount(inverse, weights=counts)
    total = np.bincount(inverse, weights=sums)
    low = np.full(len(n), np.inf)
    high = np.full(len(n), -np.inf)
    np.minimum.at(low, inverse, lows)
    np.maximum.at(high, inverse, highs)
    columns = (keys, total / n, low, high, n.astype(np.int64))
    return [list(row) for row in zip(*(c[:MAX_POINTS].tolist() for c in columns), strict=True)]


_MANY_SQL = f"""
SELECT node_id, metric_id, gpu, extract(epoch FROM t0)::float8, offsets_ms, vals, ts_pco, vals_pco
FROM telemetry_chunk
WHERE node_id = ANY(%(nodes)s) AND metric_id = ANY(%(metrics)s)
  AND t0 < to_timestamp(%(end)s)
  AND t0 >= to_timestamp(%(start)s) - interval '{MAX_CHUNK_SPAN}'
  AND t1 >= to_timestamp(%(start)s)
ORDER BY node_id, metric_id, gpu, t0
"""


# Rows a block: enough that numpy's per-call cost is spread thin, few enough that a block's
# points stay small however dense the series (a raw chunk is one batch: tens of points).
BLOCK_ROWS = 512
# Fetched from the server this many at a time where the libpq can (17 and later; before,
# row by row: the same rows, more round trips through the client library).
_STREAM_ROWS = BLOCK_ROWS if psycopg.pq.version() >= 170000 else 1


def series_points(
    *,
    node_ids: list[int],
    metric_ids: list[int],
    start: float,
    end: float,
    resolution: float = 0.0,
) -> dict[tuple[int, int, int], list[tuple[float, float]]]:
    """(node id, metric id, gpu) → its (ts, value) points in [start, end), in time order,
    of every series of these nodes and metrics that has some (one query).

    With `resolution` > 0, at most one point per series in each `resolution`-second slot
    of the epoch: the newest (of equal times, the one stored last). The rows are streamed
    and thinned a block at a time (SeriesBlocks), so what this holds is bounded by the
    series and the span, not by how many points agents sent: the detectors' window read
    every point of a 600-second span, and a soak's dense series made it millions of Python
    tuples a pass (docs/faults.md, 10)."""
    return series_columns(
        node_ids=node_ids, metric_ids=metric_ids, start=start, end=end, resolution=resolution
    ).series()


def series_columns(
    *,
    node_ids: list[int],
    metric_ids: list[int],
    start: float,
    end: float,
    resolution: float = 0.0,
) -> SeriesBlocks:
    """`series_points`' read, as read: `.series()` gives the points, `.columns()` each
    series' (ts, values) as float64 arrays (the detectors' kept window holds those)."""
    params = {"nodes": node_ids, "metrics": metric_ids, "start": start, "end": end}
    return _blocks_read(
        _MANY_SQL, params, SeriesBlocks(start=start, end=end, resolution=resolution)
    )


# Each node's chunks that may hold points in its own span, found by a (node, t1) index
# (migrations 0005, 0006) in a scan per node: the few that end in or after the span's start.
# The series index cannot find them (it holds the GPU before t0, so a bound on a chunk's
# start walks every chunk of the node's last MAX_CHUNK_SPAN), and a bound on the start per
# node had the planner AND in the BRIN on t0 at 4.5 ms a node: 10 s a pass at 16,384 ranks
# with a day of history. One constant bound on the start leaves out the partitions ahead. A
# chunk starting after its node's span may come too: the caller keeps what falls in each span.
#
# The recent chunks are raw (a row per batch and series: a second's point at 1 Hz), and a
# row costs the client ~12 µs to receive whatever it holds, so a node's raw chunks come as
# one row: every point's series (metric and GPU), chunk start (e0), offset and value, as
# arrays. Chunk starts come as timestamptz, made seconds by the client (apps.telemetry.arrays):
# the epoch in SQL cost Postgres 100 ms a pass at 16,384 ranks. A one-point raw chunk
# (327,680 a pass there) is the common case and has an index of its own, `_point` (migration
# 0006): its point is at t0 and its value is vmin (apps.telemetry.chunk_copy writes t0 as its
# first point's time, its offsets from that, and vmin), so its row is read without its arrays
# (subscripting them cost 60 ms) and its offsets come as NULL, each 0. The other branches
# scan the `_other` index of every other chunk (with one index, each scanned every chunk of
# the node to keep none of the one-point ones: a third of the read each, 300 ms a pass). A
# node's raw chunks of more points (an agent posts ten 1 Hz ticks at once) come as one row:
# each chunk's series, start and point count, and their offsets and values as their
# arrays' binary forms joined (apps.telemetry.arrays.arrays_joined). Unnesting them into a
# row a point, sorted, cost Postgres 510 ms a pass at 16,384 ranks with 7 GPU metrics;
# this, 110 ms. Every aggregate of one group reads its rows in one order, so the i-th
# chunk's series, start, count and arrays agree. Sealed (encoded) rows come as they are,
# their series and start repeated for each of their `n` points. Nothing is sorted here
# (sorting 327,680 points was a third of the server's time):
# the client orders a series' points by time, then by their chunk's start, then as read,
# which is the order a whole read gives them (apps.alerts.selectors.kept_columns), but for
# points of one series at one time in chunks that start at one time: neither read fixes
# their order.
# A chunk of node r that may hold points in its span (r.a on, up to the read's end).
_NODE_CHUNK = """c.node_id = r.node_id AND c.t1 >= to_timestamp(r.a)
      AND c.metric_id = ANY(%(metrics)s) AND c.t0 < to_timestamp(%(end)s)"""
# The predicates of migration 0006's two partial indexes, written as they are there (the
# planner uses a partial index only where it can prove its predicate from the query's).
_ONE_POINT_RAW = "c.n = 1 AND c.ts_pco IS NULL"
_NOT_ONE_POINT_RAW = "(c.n <> 1 OR c.ts_pco IS NOT NULL)"
# A point's series as one int8, metric id · gpu (blocks.SpanPoints unpacks it): one array
# for the two is ~25 ms less of Postgres a pass at 16,384 ranks.
_SERIES = "(c.metric_id::int8 << 16) | (c.gpu + 32768)"
_SPANS_SQL = f"""
SELECT r.node_id, p.series, p.t0, NULL::int4[], p.v, NULL::bytea, NULL::bytea,
       NULL::int4[], NULL::bytea, NULL::bytea
FROM unnest(%(nodes)s::int4[], %(starts)s::float8[]) AS r(node_id, a)
CROSS JOIN LATERAL (
    SELECT array_agg({_SERIES}) AS series, array_agg(c.t0) AS t0, array_agg(c.vmin) AS v
    FROM telemetry_chunk c
    WHERE {_NODE_CHUNK} AND {_ONE_POINT_RAW}
    HAVING count(*) > 0
) p
UNION ALL
SELECT r.node_id, p.series, p.t0, NULL, NULL, NULL, NULL, p.n, p.o, p.v
FROM unnest(%(nodes)s::int4[], %(starts)s::float8[]) AS r(node_id, a)
CROSS JOIN LATERAL (
    SELECT array_agg({_SERIES}) AS series, array_agg(c.t0) AS t0, array_agg(c.n) AS n,
           string_agg(array_send(c.offsets_ms), ''::bytea) AS o,
           string_agg(array_send(c.vals), ''::bytea) AS v
    FROM telemetry_chunk c
    WHERE {_NODE_CHUNK} AND {_NOT_ONE_POINT_RAW} AND c.ts_pco IS NULL
    HAVING count(*) > 0
) p
UNION ALL
SELECT c.node_id, array_fill({_SERIES}, ARRAY[c.n]), array_fill(c.t0, ARRAY[c.n]),
       c.offsets_ms, c.vals, c.ts_pco, c.vals_pco, NULL, NULL, NULL
FROM unnest(%(nodes)s::int4[], %(starts)s::float8[]) AS r(node_id, a)
CROSS JOIN LATERAL (
    SELECT * FROM telemetry_chunk c
    WHERE {_NODE_CHUNK} AND {_NOT_ONE_POINT_RAW} AND c.ts_pco IS NOT NULL
    OFFSET 0  -- a scan per node: never flattened into one scan of the table
) c
"""


def span_points(*, spans: Mapping[int, tuple[float, float]], metric_ids: list[int]) -> SpanPoints:
    """The stored points of each node's chunks that may hold points in its span [start, end)
    (node id → span, not empty; one query), as flat columns in the stored order (SpanPoints):
    a node's points outside its span may come too, and callers keep what falls in it."""
    nodes = sorted(spans)
    params = {
        "nodes": nodes,
        "starts": [spans[n][0] for n in nodes],
        "end": max(b for _, b in spans.values()),
        "metrics": metric_ids,
    }
    return _blocks_read(_SPANS_SQL, params, SpanPoints())


_Blocks = TypeVar("_Blocks", SeriesBlocks, SpanPoints)


def _blocks_read(sql: str, params: dict[str, Any], blocks: _Blocks) -> _Blocks:
    database = connections[read_alias()]
    database.ensure_connection()
    # a raw psycopg cursor: stream() fetches as it goes (Django's cursor fetches every row
    # of the result before the first is read), and arrays load as numpy, not Python lists
    with (
        query_logged(database, sql),
        arrays_as_numpy(psycopg.Cursor(database.connection)) as cursor,
    ):
        rows = cursor.stream(sql, params, binary=True, size=_STREAM_ROWS)
        while block := list(islice(rows, BLOCK_ROWS)):
            blocks.add(block)
    return blocks


def metric_id_get(*, name: str) -> int | None:
    with connections[read_alias()].cursor() as cursor:
        cursor.execute("SELECT id FROM telemetry_metric WHERE name = %s", [name])
        row = cursor.fetchone()
    return row[0] if row else None


def chunk_storage() -> dict[str, int]:
    """Bytes on disk of the chunk table (heap, TOAST and indexes) and the samples it holds."""
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            f"SELECT {relation_bytes_sql('telemetry_chunk')},"
            " (SELECT coalesce(sum(n), 0) FROM telemetry_chunk),"
            " (SELECT count(*) FROM telemetry_chunk)"
        )
        total, samples, rows = cursor.fetchone()
    return {"bytes": total, "samples": int(samples), "rows": rows}


def metric_of(*, source: str | None, name: str) -> str:
    """The stored metric name of `name` as scraped from target `source` (None: core)."""
    return f"{source}:{name}" if source else name


def source_of(metric: str) -> tuple[str | None, str]:
    """(source, name within it) of a stored metric name; (None, metric) for core ones."""
    head, sep, tail = metric.partition(":")
    if sep and tail and _SOURCE.match(head):
        return head, tail
    return None, metric


SeriesKey = tuple[str, int | None]  # (stored metric name, gpu or None for the host)


def series_grouped(*, series: Iterable[SeriesKey], source: str | None = None) -> dict[str, Any]:
    """`{"sources": [{"source", "series"}…], "series": [{"metric", "source", "name", "gpu"}…]}`:
    every source with its series count (core metrics under `None`, listed first), and the
    series of `source` (all series when None), sorted by name then GPU."""
    keys = sorted(set(series), key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    counts = Counter(source_of(metric)[0] for metric, _ in keys)
    listed = []
    for metric, gpu in keys:
        of, name = source_of(metric)
        if source is None or of == source:
            listed.append({"metric": metric, "source": of, "name": name, "gpu": gpu})
    return {
        "sources": [
            {"source": of, "series": counts[of]}
            for of in sorted(counts, key=lambda of: (of is not None, of or ""))
        ],
        "series": listed,
    }


def health_series(values_by_gpu: Mapping[int | None, Iterable[str]]) -> list[SeriesKey]:
    """Series keys from latest-health rows: metric names per GPU (None or HOST_GPU: host)."""
    return [
        (metric, None if gpu in (None, HOST_GPU) else gpu)
        for gpu, metrics in values_by_gpu.items()
        for metric in metrics
    ]


def node_series_list(*, node_id: int) -> list[SeriesKey]:
    """Every series the node ever sent: the latest-health rows keep the newest value of each
    (merged, never pruned while the node exists), one row per GPU and one for the host."""
    rows = NodeHealth.objects.filter(node_id=node_id).values_list("gpu", "values")
    return health_series({gpu: values.keys() for gpu, values in rows})


def series_known(*, node_id: int, metric: str, metric_id: int, gpu: int | None) -> bool:
    """Whether the node ever sent this series: its latest-health row names it, or (data
    written around the ingest path, e.g. seeded) a chunk of it exists."""
    gpu_key = HOST_GPU if gpu is None else gpu
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM telemetry_nodehealth"
            "  WHERE node_id = %(node)s AND gpu = %(gpu)s AND values ? %(metric)s)"
            " OR EXISTS (SELECT 1 FROM telemetry_chunk"
            "  WHERE node_id = %(node)s AND metric_id = %(metric_id)s AND gpu = %(gpu)s)",
            {"node": node_id, "gpu": gpu_key, "metric": metric, "metric_id": metric_id},
        )
        return cursor.fetchone()[0]


def source_known(*, node_id: int, source: str) -> bool:
    """Whether the node ever sent a series scraped from target `source`."""
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM telemetry_nodehealth h, jsonb_object_keys(h.values) k"
            " WHERE h.node_id = %s AND starts_with(k, %s))",
            [node_id, source + ":"],
        )
        return cursor.fetchone()[0]
