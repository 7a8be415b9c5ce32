"""Reads of history: a metric's series or a run's step timings over any range, at a
resolution that keeps each series near `max_points`, from raw data or the rollups.

Each selector is one SQL statement (plus none per node or rank), whatever the range. The SQL
takes the rollup for buckets the last rollup pass has covered and the raw data for the newer
part (after the watermark less a margin), so charts are current to the last ingested batch.
Django's cursor binds parameters on the client, so every execution is planned with its own
values; the SQL is still written so that a generic plan (a prepared statement, after psycopg's
`prepare_threshold`) stays on the indexes: every table is reached through a nested loop on
its primary key or series index from the small series/run set, never by a bare range.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson
from django.conf import settings
from django.db import connection

from apps.telemetry.models import HOST_GPU

# Agents sample at 1 Hz: a range of up to max_points seconds is shown as raw points.
RAW_SAMPLE_INTERVAL_S = 1.0
# Bucket widths, in seconds; the rollups serve 60 s and wider, raw data the narrower ones.
LADDER_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
MINUTE, HOUR, DAY = 60, 3600, 86400
# Buckets ending this long before the last rollup pass are read from the rollup, later ones
# from raw data: covers the agents' batching delay (≤ 10 s) and data in flight at the pass.
ROLLUP_FRESH_MARGIN_S = 60

Source = Literal["raw", "1m", "1h"]


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
    multiples of resolution_s since the epoch (the first bucket may start before `start`)."""

    resolution_s: float
    start: float
    end: float
    series: list[SeriesHistory]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepHistory:
    """Dense over buckets: ts[i] is bucket i's start; None where nothing was reported.
    step_time[r][i] is rank ranks[r]'s mean step time in bucket i; stages are means over
    every report of the bucket; steps_per_s counts reports per rank per second of bucket."""

    resolution_s: float
    start: float
    end: float
    ts: list[float]
    ranks: list[int]
    step_time: list[list[float | None]]
    stages: dict[str, list[float | None]]
    steps_per_s: list[float | None]
    tokens_per_s: list[float | None]
    loss: list[float | None]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Resolution:
    step: float  # 0: raw points
    source: Source


def resolution_choose(
    *, start: float, end: float, max_points: int, now: float, raw_points: bool = True
) -> Resolution:
    """The finest bucket width giving at most ~max_points buckets over [start, end), from
    the finest source whose retention still covers `start`."""
    span = max(end - start, 1.0)
    if raw_points and span <= max_points * RAW_SAMPLE_INTERVAL_S:
        step: float = 0
    else:
        wanted = span / max(max_points, 1)
        step = next((s for s in LADDER_S if s >= wanted), math.ceil(wanted / DAY) * DAY)
    if step < MINUTE and _expired(start, now, settings.HISTORY_RAW_RETENTION_DAYS):
        step = MINUTE
    if step < HOUR and _expired(start, now, settings.HISTORY_1M_RETENTION_DAYS):
        step = HOUR
    source: Source = "raw" if step < MINUTE else "1m" if step < HOUR else "1h"
    return Resolution(step=step, source=source)


def _expired(ts: float, now: float, retention_days: float) -> bool:
    return bool(retention_days) and ts < now - retention_days * DAY


# The range split between rollup and raw, as (roll_lo, roll_hi, raw_lo) in epoch seconds.
_SPLIT = """
w AS (
    SELECT CASE WHEN %(rollup)s THEN coalesce(
        (SELECT floor((extract(epoch FROM rolled_up_at) - %(margin)s) / %(step)s) * %(step)s
         FROM history_watermark WHERE id = 1), %(roll_lo)s) ELSE %(roll_lo)s END AS split
), r AS (
    SELECT %(roll_lo)s::float8 AS roll_lo,
           least(%(end)s, greatest(%(roll_lo)s, split))::float8 AS roll_hi,
           greatest(%(start)s, least(%(end)s, split))::float8 AS raw_lo
    FROM w
)"""

# The series asked for: each node's host series, one GPU, or every GPU it has reported.
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
    FROM s CROSS JOIN m CROSS JOIN r CROSS JOIN LATERAL (
        SELECT extract(epoch FROM t0)::float8 AS e0, extract(epoch FROM t1)::float8 AS e1,
               n, vmin, vmax, vsum, offsets_ms, vals
        FROM telemetry_chunk c
        WHERE c.node_id = s.node_id AND c.metric_id = m.id AND c.gpu = s.gpu
          AND c.t0 < to_timestamp(%(end)s) AND c.t1 >= to_timestamp(r.raw_lo)
          -- an uncompacted chunk holds one batch: it never starts long before its points
          AND c.t0 >= to_timestamp(r.raw_lo) - interval '1 day'
    ) c
    WHERE r.raw_lo < %(end)s
)"""

_POINTS_SQL = f"""
WITH {_SPLIT}, {_SERIES},
p AS (
    SELECT raw.node_id, raw.gpu, u.ts, u.v
    FROM raw CROSS JOIN LATERAL (
        SELECT raw.e0 + o / 1000.0 AS ts, v FROM unnest(raw.offsets_ms, raw.vals) AS x(o, v)
    ) u
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
_WHOLE = "floor(raw.e0 / %(step)s) = floor(raw.e1 / %(step)s) AND raw.e0 >= r.raw_lo"

_BUCKETS_SQL = f"""
WITH {_SPLIT}, {_SERIES},
parts AS (
    SELECT raw.node_id, raw.gpu, floor(raw.e0 / %(step)s) AS k, raw.n, raw.vsum, raw.vmin,
           raw.vmax
    FROM raw CROSS JOIN r WHERE {_WHOLE} AND raw.e1 < %(end)s
    UNION ALL
    SELECT raw.node_id, raw.gpu, floor(u.ts / %(step)s), 1, u.v, u.v, u.v
    FROM raw CROSS JOIN r CROSS JOIN LATERAL (
        SELECT raw.e0 + o / 1000.0 AS ts, v FROM unnest(raw.offsets_ms, raw.vals) AS x(o, v)
    ) u
    WHERE NOT ({_WHOLE} AND raw.e1 < %(end)s) AND u.ts >= r.raw_lo AND u.ts < %(end)s
    UNION ALL
    SELECT s.node_id, s.gpu, floor(extract(epoch FROM h.bucket) / %(step)s), h.n, h.vsum,
           h.vmin, h.vmax
    FROM s CROSS JOIN m CROSS JOIN r JOIN {{table}} h
      ON h.node_id = s.node_id AND h.metric_id = m.id AND h.gpu = s.gpu
     AND h.bucket >= to_timestamp(r.roll_lo) AND h.bucket < to_timestamp(r.roll_hi)
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
    the node has reported), in node name then GPU order, over [start, end). One query."""
    res = resolution_choose(start=start, end=end, max_points=max_points, now=time.time())
    return _metric_history(
        node_ids=node_ids,
        metric=metric,
        gpu=gpu,
        start=start,
        end=end,
        res=res,
        max_points=max_points,
    )


def _metric_history(
    *,
    node_ids: list[int],
    metric: str,
    gpu: int | None | Literal["all"],
    start: float,
    end: float,
    res: Resolution,
    max_points: int,
) -> History:
    """metric_history at a given resolution (the benchmark compares sources with it)."""
    all_gpus = gpu == "all"
    params = {
        **_split_params(start=start, end=end, res=res),
        "metric": metric,
        "nodes": list(node_ids),
        "gpu": HOST_GPU if gpu is None or all_gpus else gpu,
        "all_gpus": all_gpus,
        "max_points": max_points,
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


def _split_params(*, start: float, end: float, res: Resolution) -> dict[str, Any]:
    step = res.step or 1
    return {
        "rollup": res.source != "raw",
        "margin": ROLLUP_FRESH_MARGIN_S,
        "step": step,
        # raw only: an empty rollup range at `start`; else whole buckets from the first one
        "roll_lo": start if res.source == "raw" else math.floor(start / step) * step,
        "start": start,
        "end": end,
    }


_STEPS_SQL = f"""
WITH {_SPLIT},
raw AS (
    SELECT rank, floor(extract(epoch FROM ts) / %(step)s) AS k, count(*) AS n,
           sum(step_time) AS st_sum, sum(data_time) AS dt_sum, count(data_time) AS dt_n,
           sum(h2d_time) AS hd_sum, count(h2d_time) AS hd_n, sum(compute_time) AS cp_sum,
           count(compute_time) AS cp_n, sum(comm_wait) AS cw_sum, count(comm_wait) AS cw_n,
           sum(tokens)::float8 AS tokens, sum(loss) AS loss_sum, count(loss) AS loss_n
    FROM runs_stepreport CROSS JOIN r
    WHERE run_id = %(run)s AND ts >= to_timestamp(r.raw_lo) AND ts < to_timestamp(%(end)s)
    GROUP BY rank, k
), rolled AS (
    SELECT rank, floor(extract(epoch FROM bucket) / %(step)s) AS k, sum(n) AS n,
           sum(step_time_sum) AS st_sum, sum(data_time_sum) AS dt_sum,
           sum(data_time_n) AS dt_n, sum(h2d_time_sum) AS hd_sum, sum(h2d_time_n) AS hd_n,
           sum(compute_time_sum) AS cp_sum, sum(compute_time_n) AS cp_n,
           sum(comm_wait_sum) AS cw_sum, sum(comm_wait_n) AS cw_n,
           sum(tokens_sum)::float8 AS tokens, sum(loss_sum) AS loss_sum, sum(loss_n) AS loss_n
    FROM {{table}} CROSS JOIN r
    WHERE run_id = %(run)s AND bucket >= to_timestamp(r.roll_lo)
      AND bucket < to_timestamp(r.roll_hi)
    GROUP BY rank, k
), agg AS MATERIALIZED (
    SELECT (k - %(k0)s)::int AS i, * FROM raw UNION ALL SELECT (k - %(k0)s)::int, * FROM rolled
), grid AS (
    SELECT i FROM generate_series(0, %(buckets)s - 1) AS i
), per_rank AS (
    SELECT k.rank, json_agg(a.st_sum / a.n ORDER BY g.i) AS means
    FROM (SELECT DISTINCT rank FROM agg) k CROSS JOIN grid g
    LEFT JOIN agg a ON a.rank = k.rank AND a.i = g.i
    GROUP BY k.rank
), per_bucket AS (
    SELECT i, sum(dt_sum) / nullif(sum(dt_n), 0) AS data_time,
           sum(hd_sum) / nullif(sum(hd_n), 0) AS h2d_time,
           sum(cp_sum) / nullif(sum(cp_n), 0) AS compute_time,
           sum(cw_sum) / nullif(sum(cw_n), 0) AS comm_wait,
           sum(n)::float8 / count(*) / %(step)s AS steps_per_s,
           sum(tokens) / %(step)s AS tokens_per_s,
           sum(loss_sum) / nullif(sum(loss_n), 0) AS loss
    FROM agg GROUP BY i
)
SELECT json_build_array(
    (SELECT coalesce(json_agg(rank ORDER BY rank), '[]') FROM per_rank),
    (SELECT coalesce(json_agg(means ORDER BY rank), '[]') FROM per_rank),
    (SELECT json_build_array(json_agg(data_time ORDER BY g.i), json_agg(h2d_time ORDER BY g.i),
                             json_agg(compute_time ORDER BY g.i),
                             json_agg(comm_wait ORDER BY g.i),
                             json_agg(steps_per_s ORDER BY g.i),
                             json_agg(tokens_per_s ORDER BY g.i), json_agg(loss ORDER BY g.i))
     FROM grid g LEFT JOIN per_bucket USING (i))
)::text
"""

STEP_ROLLUP_TABLES = {"raw": "history_step_1m", "1m": "history_step_1m", "1h": "history_step_1h"}
STAGES = ("data_time", "h2d_time", "compute_time", "comm_wait")


def run_step_history(
    *, run_id: int, start: float, end: float, max_points: int = 1000
) -> StepHistory:
    """A run's step timings per rank and bucket over [start, end). One query."""
    res = resolution_choose(
        start=start, end=end, max_points=max_points, now=time.time(), raw_points=False
    )
    return _run_step_history(run_id=run_id, start=start, end=end, res=res)


def _run_step_history(*, run_id: int, start: float, end: float, res: Resolution) -> StepHistory:
    """run_step_history at a given resolution (the benchmark compares sources with it)."""
    step = res.step
    first = math.floor(start / step)
    buckets = max(1, math.ceil(end / step) - first)
    params = {
        **_split_params(start=start, end=end, res=res),
        "run": run_id,
        "k0": first,
        "buckets": buckets,
    }
    with connection.cursor() as cursor:
        cursor.execute(_STEPS_SQL.format(table=STEP_ROLLUP_TABLES[res.source]), params)
        ranks, means, per_bucket = orjson.loads(cursor.fetchone()[0])
    stages = dict(zip(STAGES, per_bucket[:4], strict=True))
    return StepHistory(
        resolution_s=step,
        start=start,
        end=end,
        ts=[(first + i) * step for i in range(buckets)],
        ranks=ranks,
        step_time=means,
        stages=stages,
        steps_per_s=per_bucket[4],
        tokens_per_s=per_bucket[5],
        loss=per_bucket[6],
    )
