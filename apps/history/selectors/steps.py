"""A run's step timings per rank and bucket, from raw step reports or the step rollups."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from django.db import connection, transaction

from apps.history.selectors.resolution import (
    Resolution,
    Split,
    history_meta,
    range_split,
    resolution_choose,
)

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


_SUMS = ", ".join(f"sum({stage}) AS {stage}_sum, count({stage}) AS {stage}_n" for stage in STAGES)
_ROLLED_SUMS = ", ".join(
    f"sum({stage}_sum) AS {stage}_sum, sum({stage}_n) AS {stage}_n" for stage in STAGES
)
_STAGE_MEANS = ", ".join(f"sum({stage}_sum) / nullif(sum({stage}_n), 0)" for stage in STAGES)

# Both parts are bounded by constants (the raw one lies after the last rollup pass), so the
# raw scan stays on the (run_id, ts) index and the rollup one on the primary key. The rank ×
# bucket means leave as one ordered array per rank (dense ones need no filling in Python).
_STEPS_SQL = f"""
WITH raw AS MATERIALIZED (
    SELECT rank, (floor(extract(epoch FROM ts)::float8 / %(step)s) - %(k0)s)::int AS i,
           step_time, data_time, h2d_time, compute_time, comm_wait, tokens, loss
    FROM runs_stepreport
    WHERE run_id = %(run)s AND ts >= to_timestamp(%(raw_lo)s) AND ts < to_timestamp(%(end)s)
      AND %(raw_lo)s < %(end)s
), rolled AS MATERIALIZED (
    SELECT rank, (floor(extract(epoch FROM bucket)::float8 / %(step)s) - %(k0)s)::int AS i,
           n, step_time_sum, {", ".join(f"{s}_sum, {s}_n" for s in STAGES)}, tokens_sum,
           loss_sum, loss_n
    FROM {{table}}
    WHERE run_id = %(run)s AND bucket >= to_timestamp(%(roll_lo)s)
      AND bucket < to_timestamp(%(roll_hi)s) AND %(roll_lo)s < %(roll_hi)s
), cells AS (
    SELECT rank, i, sum(n) AS n, sum(st_sum) AS st_sum
    FROM (SELECT rank, i, 1 AS n, step_time AS st_sum FROM raw
          UNION ALL SELECT rank, i, n, step_time_sum FROM rolled) c
    GROUP BY rank, i
), per_rank AS (
    SELECT rank, json_build_array(rank, array_agg(i ORDER BY i),
                                  array_agg(st_sum / n ORDER BY i)) AS cells
    FROM cells GROUP BY rank
), rates AS (
    -- reports per rank per second of the bucket
    SELECT i, sum(n)::float8 / count(*) / %(step)s AS steps_per_s FROM cells GROUP BY i
), buckets AS (
    SELECT i, {_SUMS}, sum(tokens)::float8 AS tokens, sum(loss) AS loss_sum,
           count(loss) AS loss_n
    FROM raw GROUP BY i
    UNION ALL
    SELECT i, {_ROLLED_SUMS}, sum(tokens_sum)::float8, sum(loss_sum), sum(loss_n)
    FROM rolled GROUP BY i
), per_bucket AS (
    SELECT json_build_array(b.i, {_STAGE_MEANS}, sum(tokens) / %(step)s,
                            sum(loss_sum) / nullif(sum(loss_n), 0), min(r.steps_per_s)) AS cells
    FROM buckets b LEFT JOIN rates r USING (i) GROUP BY b.i
)
SELECT json_build_array(
    (SELECT coalesce(json_agg(cells ORDER BY rank), '[]') FROM per_rank),
    (SELECT coalesce(json_agg(cells), '[]') FROM per_bucket)
)::text
"""

ROLLUP_TABLES = {"raw": "history_step_1m", "1m": "history_step_1m", "1h": "history_step_1h"}


def run_step_history(
    *, run_id: int, start: float, end: float, max_points: int = 1000
) -> StepHistory:
    """A run's step timings per rank and bucket over [start, end), at most ~max_points
    buckets. Two queries, whatever the rank count."""
    with transaction.atomic(savepoint=False):
        rolled_up_at, ranks = history_meta(
            count_sql="SELECT world_size FROM runs_run WHERE id = %s", params=[run_id]
        )
        res = resolution_choose(
            start=start, end=end, max_points=max_points, now=time.time(), raw_points=False,
            series=ranks,
        )  # fmt: skip
        split = range_split(start=start, end=end, res=res, rolled_up_at=rolled_up_at)
        return _step_history(run_id=run_id, start=start, end=end, res=res, split=split)


def run_step_history_at(*, run_id: int, start: float, end: float, res: Resolution) -> StepHistory:
    """run_step_history at a given resolution and source (the benchmark compares sources)."""
    with transaction.atomic(savepoint=False):
        rolled_up_at, _ = history_meta(count_sql="SELECT 0", params=[])
        split = range_split(start=start, end=end, res=res, rolled_up_at=rolled_up_at)
        return _step_history(run_id=run_id, start=start, end=end, res=res, split=split)


def _step_history(
    *, run_id: int, start: float, end: float, res: Resolution, split: Split
) -> StepHistory:
    step = res.step
    first = math.floor(start / step)
    buckets = max(1, math.ceil(end / step) - first)
    params = {
        "run": run_id,
        "step": step,
        "end": end,
        "k0": first,
        "roll_lo": split.roll_lo,
        "roll_hi": split.roll_hi,
        "raw_lo": split.raw_lo,
    }
    with connection.cursor() as cursor:
        cursor.execute(_STEPS_SQL.format(table=ROLLUP_TABLES[res.source]), params)
        per_rank, per_bucket = orjson.loads(cursor.fetchone()[0])
    # per bucket: the stages' means, tokens/s, loss, steps/s
    columns: list[list[float | None]] = [[None] * buckets for _ in range(7)]
    for i, *values in per_bucket:
        if 0 <= i < buckets:
            for column, value in zip(columns, values, strict=True):
                column[i] = value
    return StepHistory(
        resolution_s=step,
        start=start,
        end=end,
        ts=[(first + i) * step for i in range(buckets)],
        ranks=[rank for rank, _, _ in per_rank],
        step_time=[_dense(indexes, means, buckets) for _, indexes, means in per_rank],
        stages=dict(zip(STAGES, columns[:4], strict=True)),
        steps_per_s=columns[6],
        tokens_per_s=columns[4],
        loss=columns[5],
    )


def _dense(indexes: list[int], means: list[float], buckets: int) -> list[float | None]:
    """One rank's means over every bucket (indexes ascend), None where it reported nothing."""
    if indexes == list(range(buckets)):
        return means
    row: list[float | None] = [None] * buckets
    for i, mean in zip(indexes, means, strict=True):
        if 0 <= i < buckets:
            row[i] = mean
    return row
