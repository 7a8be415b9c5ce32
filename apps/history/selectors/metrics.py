"""A metric's history for several nodes: raw points, raw buckets or rollup buckets."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson
from django.db import connection

from apps.history.selectors.resolution import Resolution, range_split, resolution_choose
from apps.telemetry.models import HOST_GPU


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
        return asdict(self)


# The series asked for (each node's host series, one GPU, or every GPU it has reported) and
# their raw chunks. OFFSET 0 keeps each lateral subquery a per-series index scan: without it
# the planner may flatten it and, with a generic plan's guesses, hash-join a whole table.
_SERIES = """
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
),
raw AS (
    SELECT s.node_id, s.gpu, c.*
    FROM s CROSS JOIN m CROSS JOIN LATERAL (
        SELECT extract(epoch FROM t0)::float8 AS e0, extract(epoch FROM t1)::float8 AS e1,
               n, vmin, vmax, vsum, offsets_ms, vals
        FROM telemetry_chunk c
        WHERE c.node_id = s.node_id AND c.metric_id = m.id AND c.gpu = s.gpu
          AND c.t0 < to_timestamp(%(end)s) AND c.t1 >= to_timestamp(%(raw_lo)s)
          -- an uncompacted chunk holds one batch: it never starts long before its points
          AND c.t0 >= to_timestamp(%(raw_lo)s) - interval '1 day'
        OFFSET 0
    ) c
    WHERE %(raw_lo)s < %(end)s
)"""

_UNPACK = """CROSS JOIN LATERAL (
        SELECT raw.e0 + o / 1000.0 AS ts, v FROM unnest(raw.offsets_ms, raw.vals) AS x(o, v)
    ) u"""

_POINTS_SQL = f"""
WITH {_SERIES},
p AS (
    SELECT raw.node_id, raw.gpu, u.ts, u.v FROM raw {_UNPACK}
    WHERE u.ts >= %(start)s AND u.ts < %(end)s
), per AS (
    SELECT node_id, gpu, (array_agg(ts ORDER BY ts))[1:%(max_points)s] AS ts,
           (array_agg(v ORDER BY ts))[1:%(max_points)s] AS v
    FROM p GROUP BY node_id, gpu
)
SELECT s.name, s.gpu, json_build_array(coalesce(array_to_json(per.ts), '[]'),
                                       coalesce(array_to_json(per.v), '[]'))::text
FROM s LEFT JOIN per USING (node_id, gpu)
ORDER BY s.name, s.gpu
"""

# Chunks lying inside one bucket contribute their stored n/sum/min/max without unpacking.
_WHOLE = (
    "floor(raw.e0 / %(step)s) = floor(raw.e1 / %(step)s)"
    " AND raw.e0 >= %(raw_lo)s AND raw.e1 < %(end)s"
)

_BUCKETS_SQL = f"""
WITH {_SERIES},
parts AS (
    SELECT raw.node_id, raw.gpu, floor(raw.e0 / %(step)s) AS k, raw.n, raw.vsum, raw.vmin,
           raw.vmax
    FROM raw WHERE {_WHOLE}
    UNION ALL
    SELECT raw.node_id, raw.gpu, floor(u.ts / %(step)s), 1, u.v, u.v, u.v FROM raw {_UNPACK}
    WHERE NOT ({_WHOLE}) AND u.ts >= %(raw_lo)s AND u.ts < %(end)s
    UNION ALL
    SELECT s.node_id, s.gpu, floor(extract(epoch FROM h.bucket) / %(step)s), h.n, h.vsum,
           h.vmin, h.vmax
    FROM s CROSS JOIN m CROSS JOIN LATERAL (
        SELECT bucket, n, vsum, vmin, vmax FROM {{table}} h
        WHERE h.node_id = s.node_id AND h.metric_id = m.id AND h.gpu = s.gpu
          AND h.bucket >= to_timestamp(%(roll_lo)s) AND h.bucket < to_timestamp(%(roll_hi)s)
        OFFSET 0
    ) h
    WHERE %(roll_lo)s < %(roll_hi)s
), agg AS (
    SELECT node_id, gpu, k * %(step)s AS b, sum(vsum) / sum(n) AS avg, min(vmin) AS mn,
           max(vmax) AS mx
    FROM parts GROUP BY node_id, gpu, k
), per AS (
    SELECT node_id, gpu, json_build_array(json_agg(b ORDER BY b), json_agg(avg ORDER BY b),
                                          json_agg(mn ORDER BY b), json_agg(mx ORDER BY b)) AS j
    FROM agg GROUP BY node_id, gpu
)
SELECT s.name, s.gpu, coalesce(per.j, '[[], [], [], []]')::text
FROM s LEFT JOIN per USING (node_id, gpu)
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
    ~max_points points each. One query for raw resolutions, two for rollups."""
    res = resolution_choose(start=start, end=end, max_points=max_points, now=time.time())
    return metric_history_at(
        node_ids=node_ids,
        metric=metric,
        gpu=gpu,
        start=start,
        end=end,
        res=res,
        max_points=max_points,
    )


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
    all_gpus = gpu == "all"
    split = range_split(start=start, end=end, res=res)
    params = {
        "metric": metric,
        "nodes": list(node_ids),
        "gpu": HOST_GPU if gpu is None or all_gpus else gpu,
        "all_gpus": all_gpus,
        "max_points": max_points,
        "step": res.step,
        "start": start,
        "end": end,
        "roll_lo": split.roll_lo,
        "roll_hi": split.roll_hi,
        "raw_lo": split.raw_lo,
    }
    sql = _POINTS_SQL if res.step == 0 else _BUCKETS_SQL.format(table=ROLLUP_TABLES[res.source])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    series = []
    for name, series_gpu, data in rows:
        arrays = orjson.loads(data)
        ts, avg = arrays[0], arrays[1]
        low, high = (arrays[2], arrays[3]) if res.step else (list(avg), list(avg))
        node_gpu = None if series_gpu == HOST_GPU else series_gpu
        series.append(SeriesHistory(node=name, gpu=node_gpu, ts=ts, avg=avg, min=low, max=high))
    return History(resolution_s=res.step, start=start, end=end, series=series)
