"""A metric's history for several nodes: raw points, raw buckets or rollup buckets."""

from __future__ import annotations

import bisect
import time
from base64 import b64decode
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson
from django.db import connections, transaction

from apps.core.codec import floats_decode, ints_decode
from apps.core.db_router import read_alias
from apps.history.selectors.plain import plain
from apps.history.selectors.resolution import (
    Resolution,
    Split,
    history_meta,
    range_split,
    resolution_choose,
)
from apps.telemetry.models import HOST_GPU
from apps.telemetry.selectors import chunk_points


@dataclass(frozen=True)
class SeriesHistory:
    node: str
    gpu: int | None
    ts: list[float]
    avg: list[float]
    min: list[float]
    max: list[float]


@dataclass(frozen=True)
class History:
    """resolution_s = 0: raw points (avg = min = max); else bucket starts, aligned to
    multiples of resolution_s since the epoch (the first bucket may start before `start`).
    Buckets without data are left out of a series."""

    resolution_s: float
    start: float
    end: float
    series: list[SeriesHistory]

    def to_dict(self) -> dict[str, Any]:
        return plain(self)


# The series asked for (each node's host series, one GPU, or every GPU it has reported) and
# their raw chunks. OFFSET 0 keeps each lateral subquery a per-series index scan: without it
# the planner may flatten it and, with a generic plan's guesses, hash-join a whole table.
_SERIES_ONLY = """
m AS (SELECT id FROM telemetry_metric WHERE name = %(metric)s),
s AS (
    SELECT n.id AS node_id, n.name, g.gpu
    FROM clusters_node n CROSS JOIN LATERAL (
        SELECT %(gpu)s::int2 AS gpu WHERE NOT %(all_gpus)s
        UNION ALL
        SELECT h.gpu::int2 FROM telemetry_nodehealth h
        WHERE %(all_gpus)s AND h.node_id = n.id AND h.gpu >= 0
    ) g
    WHERE n.id = ANY(%(nodes)s)
)"""
_SERIES = (
    _SERIES_ONLY
    + """,
raw AS (
    SELECT s.node_id, s.gpu, c.*
    FROM s CROSS JOIN m CROSS JOIN LATERAL (
        SELECT extract(epoch FROM t0)::float8 AS e0, extract(epoch FROM t1)::float8 AS e1,
               n, vmin, vmax, vsum, offsets_ms, vals, ts_pco, vals_pco
        FROM telemetry_chunk c
        WHERE c.node_id = s.node_id AND c.metric_id = m.id AND c.gpu = s.gpu
          AND c.t0 < to_timestamp(%(end)s) AND c.t1 >= to_timestamp(%(raw_lo)s)
          -- an uncompacted chunk holds one batch: it never starts long before its points
          AND c.t0 >= to_timestamp(%(raw_lo)s) - interval '1 day'
        OFFSET 0
    ) c
    WHERE %(raw_lo)s < %(end)s
)"""
)

# Raw points leave as their chunks' arrays (sealed chunks: their encoded bytes in base64),
# ordered per series; Python decodes, filters and offsets them (cheaper than unnesting,
# sorting and re-aggregating a point per row in SQL).
_POINTS_SQL = f"""
WITH {_SERIES},
per AS (
    SELECT node_id, gpu,
           json_agg(json_build_array(e0, offsets_ms, vals, encode(ts_pco, 'base64'),
                                     encode(vals_pco, 'base64')) ORDER BY e0) AS chunks
    FROM raw GROUP BY node_id, gpu
)
SELECT s.name, s.gpu, coalesce(per.chunks, '[]')::text
FROM s LEFT JOIN per USING (node_id, gpu)
ORDER BY s.name, s.gpu
"""

# Chunks lying inside one bucket contribute their stored n/sum/min/max without unpacking.
_WHOLE = "floor(c.e0 / %(step)s) = floor(c.e1 / %(step)s) AND c.e0 >= %(raw_lo)s AND c.e1 < %(end)s"

# Sealed chunks not lying inside one bucket: their points are encoded, so they leave as
# bytes (base64) for Python to decode and add to the buckets.
_SEALED_PARTS = f"""
SELECT coalesce(json_agg(json_build_array(c.e0, encode(c.ts_pco, 'base64'),
                                          encode(c.vals_pco, 'base64'))), '[]')
FROM (
    SELECT extract(epoch FROM t0)::float8 AS e0, extract(epoch FROM t1)::float8 AS e1,
           ts_pco, vals_pco
    FROM telemetry_chunk c
    WHERE c.node_id = s.node_id AND c.metric_id = m.id AND c.gpu = s.gpu
      AND c.t0 < to_timestamp(%(end)s) AND c.t1 >= to_timestamp(%(raw_lo)s)
      AND c.t0 >= to_timestamp(%(raw_lo)s) - interval '1 day'
      AND %(raw_lo)s < %(end)s AND c.ts_pco IS NOT NULL
    OFFSET 0
) c
WHERE NOT ({_WHOLE})
"""

# Bucketed per series, inside a lateral subquery: each series' few hundred buckets are
# grouped and ordered on their own, instead of every series' rows in one big hash and sort.
_BUCKETS_SQL = f"""
WITH {_SERIES_ONLY}
SELECT s.name, s.gpu, per.j::text
FROM s CROSS JOIN m CROSS JOIN LATERAL (
    SELECT json_build_array(coalesce(json_agg(k ORDER BY k), '[]'),
                            coalesce(json_agg(sm ORDER BY k), '[]'),
                            coalesce(json_agg(mn ORDER BY k), '[]'),
                            coalesce(json_agg(mx ORDER BY k), '[]'),
                            coalesce(json_agg(cnt ORDER BY k), '[]'),
                            ({_SEALED_PARTS})) AS j
    FROM (
        SELECT k, sum(vsum) AS sm, min(vmin) AS mn, max(vmax) AS mx, sum(n) AS cnt
        FROM (
            SELECT p.* FROM (
                SELECT extract(epoch FROM t0)::float8 AS e0,
                       extract(epoch FROM t1)::float8 AS e1, n, vmin, vmax, vsum,
                       offsets_ms, vals
                FROM telemetry_chunk c
                WHERE c.node_id = s.node_id AND c.metric_id = m.id AND c.gpu = s.gpu
                  AND c.t0 < to_timestamp(%(end)s) AND c.t1 >= to_timestamp(%(raw_lo)s)
                  AND c.t0 >= to_timestamp(%(raw_lo)s) - interval '1 day'
                  AND %(raw_lo)s < %(end)s
                OFFSET 0
            ) c CROSS JOIN LATERAL (
                SELECT floor(c.e0 / %(step)s) AS k, c.n, c.vsum, c.vmin, c.vmax WHERE {_WHOLE}
                UNION ALL
                SELECT floor(u.ts / %(step)s), 1, u.v, u.v, u.v
                FROM (SELECT c.e0 + o / 1000::float8 AS ts, v
                      FROM unnest(c.offsets_ms, c.vals) AS x(o, v)) u
                WHERE NOT ({_WHOLE}) AND u.ts >= %(raw_lo)s AND u.ts < %(end)s
            ) p
            UNION ALL
            SELECT floor(extract(epoch FROM h.bucket)::float8 / %(step)s), h.n, h.vsum, h.vmin,
                   h.vmax
            FROM {{table}} h
            WHERE h.node_id = s.node_id AND h.metric_id = m.id AND h.gpu = s.gpu
              AND h.bucket >= to_timestamp(%(roll_lo)s) AND h.bucket < to_timestamp(%(roll_hi)s)
              AND %(roll_lo)s < %(roll_hi)s
        ) parts
        GROUP BY k
    ) agg
) per
ORDER BY s.name, s.gpu
"""

# Raw-sourced buckets narrower than a minute carry no rollup part; the table is unused.
ROLLUP_TABLES = {"raw": "history_sample_1m", "1m": "history_sample_1m", "1h": "history_sample_1h"}


def metric_history(
    *,
    node_ids: list[int],
    metric: str,
    gpu: int | None | Literal["all"],
    start: float,
    end: float,
    max_points: int = 1000,
) -> History:
    """One series per node (gpu None: the host series; an int: that GPU; "all": every GPU
    the node has reported), in node name then GPU order, over [start, end), at most
    ~max_points points each. Two queries, whatever the node count."""
    if gpu == "all":
        count_sql = "SELECT count(*) FROM telemetry_nodehealth WHERE node_id = ANY(%s) AND gpu >= 0"
        count_params: list = [list(node_ids)]
    else:
        count_sql, count_params = "SELECT %s", [len(node_ids)]
    with transaction.atomic(using=read_alias(), savepoint=False):
        rolled_up_at, series = history_meta(count_sql=count_sql, params=count_params)
        res = resolution_choose(
            start=start, end=end, max_points=max_points, now=time.time(), series=series
        )
        split = range_split(start=start, end=end, res=res, rolled_up_at=rolled_up_at)
        query = SeriesQuery(node_ids=node_ids, metric=metric, gpu=gpu, start=start, end=end)
        return _history(query=query, res=res, split=split, max_points=max_points)


def metric_history_at(
    *,
    node_ids: list[int],
    metric: str,
    gpu: int | None | Literal["all"],
    start: float,
    end: float,
    res: Resolution,
    max_points: int = 1000,
) -> History:
    """metric_history at a given resolution and source (the benchmark compares sources)."""
    with transaction.atomic(using=read_alias(), savepoint=False):
        rolled_up_at, _ = history_meta(count_sql="SELECT 0", params=[])
        split = range_split(start=start, end=end, res=res, rolled_up_at=rolled_up_at)
        query = SeriesQuery(node_ids=node_ids, metric=metric, gpu=gpu, start=start, end=end)
        return _history(query=query, res=res, split=split, max_points=max_points)


@dataclass(frozen=True)
class SeriesQuery:
    node_ids: list[int]
    metric: str
    gpu: int | None | Literal["all"]
    start: float
    end: float


def _history(*, query: SeriesQuery, res: Resolution, split: Split, max_points: int) -> History:
    all_gpus = query.gpu == "all"
    params = {
        "metric": query.metric,
        "nodes": list(query.node_ids),
        "gpu": HOST_GPU if query.gpu is None or all_gpus else query.gpu,
        "all_gpus": all_gpus,
        "step": res.step,
        "start": query.start,
        "end": query.end,
        "roll_lo": split.roll_lo,
        "roll_hi": split.roll_hi,
        "raw_lo": split.raw_lo,
    }
    sql = _POINTS_SQL if res.step == 0 else _BUCKETS_SQL.format(table=ROLLUP_TABLES[res.source])
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    series = []
    for name, series_gpu, data in rows:
        if res.step:
            ts, avg, low, high = _buckets(orjson.loads(data), params)
        else:
            ts, avg = _points(orjson.loads(data), query.start, query.end, max_points)
            low, high = list(avg), list(avg)
        node_gpu = None if series_gpu == HOST_GPU else series_gpu
        series.append(SeriesHistory(node=name, gpu=node_gpu, ts=ts, avg=avg, min=low, max=high))
    return History(resolution_s=res.step, start=query.start, end=query.end, series=series)


def _buckets(data: list, params: dict[str, Any]) -> list[list]:
    """[bucket starts, avgs, mins, maxes] of a series: the SQL's buckets (keys, sums, mins,
    maxes, counts) with the points of its sealed chunks that straddle buckets added."""
    keys, sums, lows, highs, counts, sealed = data
    buckets = {
        key: [float(total), float(low), float(high), count]
        for key, total, low, high, count in zip(keys, sums, lows, highs, counts, strict=True)
    }
    for key, total, low, high, count in _sealed_buckets(sealed, params):
        bucket = buckets.setdefault(key, [0.0, low, high, 0])
        bucket[0] += total
        bucket[1], bucket[2] = min(bucket[1], low), max(bucket[2], high)
        bucket[3] += count
    ordered = sorted(buckets.items()) if sealed else list(buckets.items())
    step = params["step"]
    return [
        [key * step for key, _ in ordered],
        [b[0] / b[3] for _, b in ordered],
        [b[1] for _, b in ordered],
        [b[2] for _, b in ordered],
    ]


def _sealed_buckets(sealed: list[list], params: dict[str, Any]) -> Iterable[tuple]:
    """(bucket key, sum, min, max, count) of the points of these encoded chunks
    ([e0, offsets, values] with base64 bytes) in [raw_lo, end)."""
    if not sealed:
        return []
    parts = [chunk_points(e0, None, None, b64decode(ts), b64decode(vs)) for e0, ts, vs in sealed]
    ts, values = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    inside = (ts >= params["raw_lo"]) & (ts < params["end"])
    keys, inverse = np.unique(np.floor(ts[inside] / params["step"]), return_inverse=True)
    values = values[inside]
    low, high = np.full(len(keys), np.inf), np.full(len(keys), -np.inf)
    np.minimum.at(low, inverse, values)
    np.maximum.at(high, inverse, values)
    sums = np.bincount(inverse, weights=values, minlength=len(keys))
    counts = np.bincount(inverse, minlength=len(keys))
    return zip(*(c.tolist() for c in (keys, sums, low, high, counts)), strict=True)


def _points(
    chunks: list[list], start: float, end: float, max_points: int
) -> tuple[list[float], list[float]]:
    """The (ts, value) points of a series' chunks within [start, end), in time order, at most
    max_points. A chunk's offsets ascend, so only its edges are searched (bisect), and its
    values are sliced, not visited one by one."""
    ts: list[float] = []
    values: list[float] = []
    ordered = True
    for e0, offsets, chunk_values, ts_pco, vals_pco in chunks:
        if ts_pco is not None:  # sealed: encoded
            offsets = ints_decode(b64decode(ts_pco)).tolist()
            chunk_values = floats_decode(b64decode(vals_pco)).tolist()

        def at(offset: int, e0: float = e0) -> float:
            return e0 + offset / 1000

        first = bisect.bisect_left(offsets, start, key=at)
        last = bisect.bisect_left(offsets, end, key=at)
        if first < last:
            ordered = ordered and (not ts or ts[-1] <= at(offsets[first]))
            ts.extend([e0 + offset / 1000 for offset in offsets[first:last]])
            values.extend(chunk_values[first:last])
    if not ordered:  # uncompacted chunks of a replayed batch may overlap others
        pairs = sorted(zip(ts, values, strict=True))
        ts, values = [t for t, _ in pairs], [v for _, v in pairs]
    return ts[:max_points], values[:max_points]
