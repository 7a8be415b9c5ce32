"""A run's step timings per rank and bucket, from raw step reports or the step rollups."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from django.db import connection

from apps.history.selectors.resolution import Resolution, range_split, resolution_choose

STAGES = ("data_time", "h2d_time", "compute_time", "comm_wait")


@dataclass(frozen=True)
class StepHistory:
    """Dense over buckets: ts[i] is bucket i's start (aligned to multiples of resolution_s;
    never 0: steps are always bucketed, 1 s at the finest), None where nothing was
    reported. step_time[r][i] is rank ranks[r]'s mean step time in bucket i; stages[name][i]
    the mean of that stage over every report in bucket i (ranks report at the same cadence,
    so this is the mean over ranks); steps_per_s[i] reports per rank per second of the
    bucket (the newest bucket may be partial); tokens_per_s[i] all ranks' tokens per second;
    loss[i] the mean reported loss."""

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


_SUMS = "count(*) AS n, sum(step_time) AS st_sum, " + ", ".join(
    f"sum({stage}) AS {stage}_sum, count({stage}) AS {stage}_n" for stage in STAGES
)
_ROLLED_SUMS = "sum(n) AS n, sum(step_time_sum) AS st_sum, " + ", ".join(
    f"sum({stage}_sum) AS {stage}_sum, sum({stage}_n) AS {stage}_n" for stage in STAGES
)
_STAGE_MEANS = ", ".join(
    f"sum({stage}_sum) / nullif(sum({stage}_n), 0) AS {stage}" for stage in STAGES
)
_STAGE_ARRAYS = ", ".join(f"json_agg({stage} ORDER BY g.i)" for stage in STAGES)

# Both parts are bounded by constants (the raw one lies after the last rollup pass), so the
# raw scan stays on the BRIN index of ts and the rollup one on the primary key.
_STEPS_SQL = f"""
WITH raw AS (
    SELECT rank, floor(extract(epoch FROM ts) / %(step)s) AS k, {_SUMS},
           sum(tokens)::float8 AS tokens, sum(loss) AS loss_sum, count(loss) AS loss_n
    FROM runs_stepreport
    WHERE run_id = %(run)s AND ts >= to_timestamp(%(raw_lo)s) AND ts < to_timestamp(%(end)s)
      AND %(raw_lo)s < %(end)s
    GROUP BY rank, k
), rolled AS (
    SELECT rank, floor(extract(epoch FROM bucket) / %(step)s) AS k, {_ROLLED_SUMS},
           sum(tokens_sum)::float8 AS tokens, sum(loss_sum) AS loss_sum, sum(loss_n) AS loss_n
    FROM {{table}}
    WHERE run_id = %(run)s AND bucket >= to_timestamp(%(roll_lo)s)
      AND bucket < to_timestamp(%(roll_hi)s) AND %(roll_lo)s < %(roll_hi)s
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
    SELECT i, {_STAGE_MEANS}, sum(n)::float8 / count(*) / %(step)s AS steps_per_s,
           sum(tokens) / %(step)s AS tokens_per_s, sum(loss_sum) / nullif(sum(loss_n), 0) AS loss
    FROM agg GROUP BY i
)
SELECT json_build_array(
    (SELECT coalesce(json_agg(rank ORDER BY rank), '[]') FROM per_rank),
    (SELECT coalesce(json_agg(means ORDER BY rank), '[]') FROM per_rank),
    (SELECT json_build_array({_STAGE_ARRAYS}, json_agg(steps_per_s ORDER BY g.i),
                             json_agg(tokens_per_s ORDER BY g.i), json_agg(loss ORDER BY g.i))
     FROM grid g LEFT JOIN per_bucket USING (i))
)::text
"""

ROLLUP_TABLES = {"raw": "history_step_1m", "1m": "history_step_1m", "1h": "history_step_1h"}


def run_step_history(
    *, run_id: int, start: float, end: float, max_points: int = 1000
) -> StepHistory:
    """A run's step timings per rank and bucket over [start, end), at most ~max_points
    buckets. One query for raw resolutions, two for rollups, whatever the rank count."""
    res = resolution_choose(
        start=start, end=end, max_points=max_points, now=time.time(), raw_points=False
    )
    return run_step_history_at(run_id=run_id, start=start, end=end, res=res)


def run_step_history_at(*, run_id: int, start: float, end: float, res: Resolution) -> StepHistory:
    """run_step_history at a given resolution and source (the benchmark compares sources)."""
    step = res.step
    first = math.floor(start / step)
    buckets = max(1, math.ceil(end / step) - first)
    split = range_split(start=start, end=end, res=res)
    params = {
        "run": run_id,
        "step": step,
        "end": end,
        "k0": first,
        "buckets": buckets,
        "roll_lo": split.roll_lo,
        "roll_hi": split.roll_hi,
        "raw_lo": split.raw_lo,
    }
    with connection.cursor() as cursor:
        cursor.execute(_STEPS_SQL.format(table=ROLLUP_TABLES[res.source]), params)
        ranks, means, per_bucket = orjson.loads(cursor.fetchone()[0])
    return StepHistory(
        resolution_s=step,
        start=start,
        end=end,
        ts=[(first + i) * step for i in range(buckets)],
        ranks=ranks,
        step_time=means,
        stages=dict(zip(STAGES, per_bucket[:4], strict=True)),
        steps_per_s=per_bucket[4],
        tokens_per_s=per_bucket[5],
        loss=per_bucket[6],
    )
