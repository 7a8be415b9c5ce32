"""A run's step timings over a range: the run as a whole per bucket (throughput, stages, loss)
and each rank per bucket (step time, and step time less collective wait), from raw step
reports after the last rollup pass and the step rollups before it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.db import connections, transaction

from apps.core.db_router import read_alias
from apps.history.selectors.plain import plain
from apps.history.selectors.resolution import (
    RANK_ROLLUP_ROW_BUDGET,
    RAW_POINT_BUDGET,
    RUN_STEP_TIERS,
    STEP_TIERS,
    TIERS,
    Resolution,
    Split,
    _expired,
    history_meta,
    range_split,
    resolution_choose,
)

STAGES = ("data_time", "h2d_time", "compute_time", "comm_wait")


@dataclass(frozen=True)
class StepHistory:
    """The run as a whole, dense over buckets: ts[i] is bucket i's start (aligned to
    multiples of resolution_s; never 0: steps are always bucketed, 1 s at the finest), None
    where nothing was reported. stages[name][i] is the mean of that stage over every report
    in bucket i (ranks report at the same cadence, so the mean over ranks); steps_per_s[i]
    reports per reporting rank per second of the bucket (the newest bucket may be partial);
    tokens_per_s[i] all ranks' tokens per second; loss[i] the mean reported loss."""

    resolution_s: float
    start: float
    end: float
    ts: list[float]
    stages: dict[str, list[float | None]]
    steps_per_s: list[float | None]
    tokens_per_s: list[float | None]
    loss: list[float | None]

    def to_dict(self) -> dict[str, Any]:
        return plain(self)


@dataclass(frozen=True)
class RankHistory:
    """Each rank, dense over the same buckets as StepHistory: step_time[r][i] is rank
    ranks[r]'s mean step time in bucket i, busy[r][i] its mean step time less collective
    wait (its own work: in synchronous training every rank's step time is the slowest
    one's, so it is this that singles out a straggler); None where it reported nothing."""

    resolution_s: float
    start: float
    end: float
    ts: list[float]
    ranks: list[int]
    step_time: list[list[float | None]]
    busy: list[list[float | None]]

    def to_dict(self) -> dict[str, Any]:
        return plain(self)


def _bucket(column: str) -> str:
    # date_part, not extract: the same float8 (both the nearest one to the exact seconds), but
    # extract goes through numeric, which made it most of the cost of bucketing 100 k rows
    return f"(floor(date_part('epoch', {column}) / %(step)s) - %(k0)s)::int"


# Both parts are bounded by constants (the raw one lies after the last rollup pass), so the
# raw scan stays on the (run_id, ts) index and the rollup one on its primary key.
_RAW = """
    FROM runs_stepreport
    WHERE run_id = %(run)s AND ts >= to_timestamp(%(raw_lo)s) AND ts < to_timestamp(%(end)s)
      AND %(raw_lo)s < %(end)s"""
_ROLLED = """
    FROM {table}
    WHERE run_id = %(run)s AND bucket >= to_timestamp(%(roll_lo)s)
      AND bucket < to_timestamp(%(roll_hi)s) AND %(roll_lo)s < %(roll_hi)s"""

_STAGE_SUMS = ", ".join(f"sum({s}) AS {s}_sum, count({s}) AS {s}_n" for s in STAGES)
_STAGE_ROLLED = ", ".join(f"sum({s}_sum) AS {s}_sum, sum({s}_n) AS {s}_n" for s in STAGES)
_STAGE_MEANS = ", ".join(f"sum({s}_sum) / nullif(sum({s}_n), 0)" for s in STAGES)

# Per bucket: n reports, the ranks that reported (raw: counted distinct; rolled up: the most
# that reported in one of the bucket's minutes), sums. One JSON array back.
_RUN_SQL = f"""
WITH buckets AS (
    SELECT {_bucket("ts")} AS i, count(*) AS n, count(DISTINCT rank) AS ranks, {_STAGE_SUMS},
           sum(tokens)::float8 AS tokens, sum(loss) AS loss_sum, count(loss) AS loss_n {_RAW}
    GROUP BY 1
    UNION ALL
    SELECT {_bucket("bucket")}, sum(n), max(ranks), {_STAGE_ROLLED}, sum(tokens_sum)::float8,
           sum(loss_sum), sum(loss_n) {_ROLLED}
    GROUP BY 1
)
SELECT coalesce(json_agg(cells), '[]')::text FROM (
    SELECT json_build_array(
        i, {_STAGE_MEANS}, sum(tokens) / %(step)s, sum(loss_sum) / nullif(sum(loss_n), 0),
        sum(n)::float8 / max(ranks) / %(step)s
    ) AS cells
    FROM buckets GROUP BY i
) per_bucket
"""

# Per rank: its buckets' indexes, mean step times and mean busy times, as one ordered array
# each (dense ones need no filling in Python).
_RANK_SQL = f"""
WITH cells AS (
    SELECT rank, i, sum(n) AS n, sum(st_sum) AS st_sum, sum(busy_sum) AS busy_sum
    FROM (
        SELECT rank, {_bucket("ts")} AS i, 1 AS n, step_time AS st_sum,
               step_time - coalesce(comm_wait, 0) AS busy_sum {_RAW}
        UNION ALL
        SELECT rank, {_bucket("bucket")}, n, step_time_sum, busy_sum {_ROLLED}
    ) c
    GROUP BY rank, i
)
SELECT coalesce(json_agg(r ORDER BY rank), '[]')::text FROM (
    SELECT rank, json_build_array(rank, array_agg(i ORDER BY i), array_agg(st_sum / n ORDER BY i),
                                  array_agg(busy_sum / n ORDER BY i)) AS r
    FROM cells GROUP BY rank
) per_rank
"""

# Source → table; "raw" reads no rollup rows (its rollup range is empty), any table serves.
RUN_TABLES = {
    "raw": "history_runstep_1m",
    "10s": "history_runstep_10s",
    "1m": "history_runstep_1m",
    "1h": "history_runstep_1h",
}
RANK_TABLES = {
    "raw": "history_step_1m",
    "10s": "history_step_10s",
    "1m": "history_step_1m",
    "10m": "history_step_10m",
    "1h": "history_step_1h",
}


def run_step_history(
    *, run_id: int, start: float, end: float, max_points: int = 1000
) -> StepHistory:
    """The run as a whole over [start, end), at most ~max_points buckets. Two queries (a
    wide range of many ranks reads the rollups: see resolution_choose)."""
    with transaction.atomic(using=read_alias(), savepoint=False):
        res, split = _plan(
            run_id, start, end, max_points=max_points, tiers=RUN_STEP_TIERS, tier_series=1
        )
        return _run_history(run_id, start, end, res=res, split=split)


def run_rank_history(
    *, run_id: int, start: float, end: float, max_points: int = 1000
) -> RankHistory:
    """Each rank over [start, end), at most ~max_points buckets. Two queries, whatever the
    rank count (a wide range of many ranks reads the rollups, and a tier of more than
    RANK_ROLLUP_ROW_BUDGET rows gives way to a coarser one: see resolution_choose)."""
    with transaction.atomic(using=read_alias(), savepoint=False):
        res, split = _plan_ranks(run_id, start, end, max_points=max_points)
        return _rank_history(run_id, start, end, res=res, split=split)


def run_step_history_at(*, run_id: int, start: float, end: float, res: Resolution) -> StepHistory:
    """run_step_history at a given resolution and source (the benchmark compares sources)."""
    with transaction.atomic(using=read_alias(), savepoint=False):
        return _run_history(run_id, start, end, res=res, split=_split_at(start, end, res))


def run_rank_history_at(*, run_id: int, start: float, end: float, res: Resolution) -> RankHistory:
    """run_rank_history at a given resolution and source (the benchmark compares sources)."""
    with transaction.atomic(using=read_alias(), savepoint=False):
        return _rank_history(run_id, start, end, res=res, split=_split_at(start, end, res))


def _plan_ranks(
    run_id: int, start: float, end: float, *, max_points: int
) -> tuple[Resolution, Split]:
    """_plan for the per-rank reads, one for all of them, so that the heat-map, its JSON and
    every other per-rank view of a range choose the same buckets."""
    return _plan(
        run_id, start, end, max_points=max_points, tiers=STEP_TIERS,
        row_budget=RANK_ROLLUP_ROW_BUDGET,
    )  # fmt: skip


def _plan(
    run_id: int, start: float, end: float, *, max_points: int, tiers: tuple[str, ...],
    row_budget: int = RAW_POINT_BUDGET, tier_series: int | None = None,
) -> tuple[Resolution, Split]:  # fmt: skip
    """Resolution and rollup/raw split; call in the selector's transaction (READ_SETTINGS
    then apply to its data query). Raw reports count against the raw-point budget one per
    rank per second (the run's world size), rollup rows against `row_budget` one per rank
    per bucket of the tier, or `tier_series` per bucket (the run-level tiers: one)."""
    rolled_up_at, signed = history_meta(
        count_sql=_WORLD_SIGNED_SQL,
        params=[run_id, end, start, settings.STEP_CHUNK_SECONDS, start, run_id],
    )
    world, compacted = abs(signed), signed < 0
    now = time.time()
    res = resolution_choose(
        start=start, end=end, max_points=max_points, now=now, raw_points=False,
        series=world, tiers=tiers, row_budget=row_budget, tier_series=tier_series,
    )  # fmt: skip
    if compacted:
        res = _rolled_up(res, start=start, now=now, tiers=tiers)
    return res, range_split(start=start, end=end, res=res, rolled_up_at=rolled_up_at)


# The run's world size, negative when some of its reports in [start, end) are compacted
# (apps/runs/compaction: columnar chunks that only apps.runs decodes): folded into
# history_meta's one query. A (run, window) index probe.
_WORLD_SIGNED_SQL = """
SELECT world_size * CASE WHEN EXISTS (
    SELECT 1 FROM runs_stepchunk WHERE run_id = %s AND "window" < to_timestamp(%s)
      AND "window" > to_timestamp(%s) - make_interval(secs => %s) AND t1 >= to_timestamp(%s)
) THEN -1 ELSE 1 END FROM runs_run WHERE id = %s"""


def _rolled_up(res: Resolution, *, start: float, now: float, tiers: tuple[str, ...]) -> Resolution:
    """A range with compacted reports is read from the finest rollup tier that still covers
    `start` instead of raw: the compaction never runs ahead of the rollups (it leaves a
    window raw until the rollup pass took it), so they hold every report."""
    if res.source != "raw":
        return res
    retained = [n for n in tiers if not _expired(start, now, getattr(settings, TIERS[n][1]))]
    name = (retained or [tiers[-1]])[0]
    width = TIERS[name][0]
    return Resolution(step=math.ceil(res.step / width) * width, source=name)  # type: ignore[arg-type]


def _split_at(start: float, end: float, res: Resolution) -> Split:
    rolled_up_at, _ = history_meta(count_sql="SELECT 0", params=[])
    return range_split(start=start, end=end, res=res, rolled_up_at=rolled_up_at)


def _params(
    run_id: int, start: float, end: float, *, res: Resolution, split: Split
) -> tuple[dict[str, Any], int, list[float]]:
    """The data query's parameters, the bucket count and the bucket starts."""
    first = math.floor(start / res.step)
    params = {
        "run": run_id,
        "step": res.step,
        "end": end,
        "k0": first,
        "roll_lo": split.roll_lo,
        "roll_hi": split.roll_hi,
        "raw_lo": split.raw_lo,
        # buckets the rollup part spans (from roll_lo, bucket `first`'s start)
        "roll_cells": max(0, math.ceil((split.roll_hi - split.roll_lo) / res.step)),
    }
    count = max(1, math.ceil(end / res.step) - first)
    return params, count, [(first + i) * res.step for i in range(count)]


def _read(
    sql: str, tables: dict[str, str], run_id: int, start: float, end: float, *,
    res: Resolution, split: Split,
) -> tuple[Any, int, list[float]]:  # fmt: skip
    """The query's JSON answer, the bucket count and the bucket starts."""
    params, count, ts = _params(run_id, start, end, res=res, split=split)
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(sql.format(table=tables[res.source]), params)
        answer = orjson.loads(cursor.fetchone()[0])
    return answer, count, ts


def _run_history(
    run_id: int, start: float, end: float, *, res: Resolution, split: Split
) -> StepHistory:
    per_bucket, count, ts = _read(_RUN_SQL, RUN_TABLES, run_id, start, end, res=res, split=split)
    # per bucket: the stages' means, tokens/s, loss, steps/s
    columns: list[list[float | None]] = [[None] * count for _ in range(7)]
    for i, *values in per_bucket:
        if 0 <= i < count:
            for column, value in zip(columns, values, strict=True):
                column[i] = value
    return StepHistory(
        resolution_s=res.step,
        start=start,
        end=end,
        ts=ts,
        stages=dict(zip(STAGES, columns[:4], strict=True)),
        steps_per_s=columns[6],
        tokens_per_s=columns[4],
        loss=columns[5],
    )


def _rank_history(
    run_id: int, start: float, end: float, *, res: Resolution, split: Split
) -> RankHistory:
    per_rank, count, ts = _read(_RANK_SQL, RANK_TABLES, run_id, start, end, res=res, split=split)
    return RankHistory(
        resolution_s=res.step,
        start=start,
        end=end,
        ts=ts,
        ranks=[rank for rank, *_ in per_rank],
        step_time=[_dense(indexes, means, count) for _, indexes, means, _ in per_rank],
        busy=[_dense(indexes, busy, count) for _, indexes, _, busy in per_rank],
    )


def _dense(indexes: list[int], means: list[float | None], buckets: int) -> list[float | None]:
    """One rank's means over every bucket (indexes ascend), None where it reported nothing."""
    if indexes == list(range(buckets)):
        return means
    row: list[float | None] = [None] * buckets
    for i, mean in zip(indexes, means, strict=True):
        if 0 <= i < buckets:
            row[i] = mean
    return row
