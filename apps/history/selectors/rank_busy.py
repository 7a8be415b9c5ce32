"""Each rank's busy time over a range as a numpy matrix (the heat-map's read): the cells
run_rank_history would read, as three packed columns rather than JSON (apps.history.
selectors.steps holds the plan, the parameters and the shared SQL fragments)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from django.db import connections, transaction

from apps.core.db_router import read_alias
from apps.history.selectors.resolution import TIERS
from apps.history.selectors.steps import (
    _RAW,
    _ROLLED,
    RANK_TABLES,
    _bucket,
    _params,
    _plan_ranks,
)


@dataclass(frozen=True)
class RankBusy:
    """RankHistory's busy times as a numpy matrix (the heat-map's read, at 1,024 ranks 100 k
    cells): busy[r, i] is rank ranks[r]'s mean busy time in bucket i (ts[i] its start), NaN
    where it reported none; reported[r, i] whether it did (a stored sum that is not finite
    gives an infinite or NaN mean that still counts as reported, as in RankHistory)."""

    resolution_s: float
    start: float
    end: float
    ts: list[float]
    ranks: list[int]
    busy: np.ndarray
    reported: np.ndarray


# Per cell (rank, bucket) with a report: the rank, the bucket index (-1 - index where the mean
# is null: no report had a busy time) and the mean, each cell's in the same order in three
# bytea of big-endian int4, int4 and float8 that numpy reads as they are (writing 100 k
# floats as JSON text, and parsing them, took more than reading them). The rollup part is
# grouped bucket by bucket (a lateral primary-key range each, its ~1,000 ranks hashed in
# cache), not all 100 k cells of 1,024 ranks in one hash table: 40 % less time. No cell has
# rows in both parts: the raw part begins at a bucket boundary (range_split).
_RANK_BUSY_SQL = f"""
SELECT coalesce(string_agg(int4send(rank), ''), ''),
       coalesce(string_agg(int4send(CASE WHEN mean IS NULL THEN -1 - i ELSE i END), ''), ''),
       coalesce(string_agg(float8send(coalesce(mean, 'NaN')), ''), '')
FROM (
    SELECT rank, {_bucket("ts")} AS i, sum(step_time - coalesce(comm_wait, 0)) / count(*) AS mean
    {_RAW}
    GROUP BY 1, 2
    UNION ALL
    {{rolled}}
) cells
"""
_RANK_BUSY_GROUPED = f"""SELECT c.rank, g.i, c.busy_sum / c.n
    FROM generate_series(0, %(roll_cells)s - 1) AS g(i) CROSS JOIN LATERAL (
        SELECT rank, sum(n) AS n, sum(busy_sum) AS busy_sum {_ROLLED}
          AND bucket >= to_timestamp((%(k0)s + g.i) * %(step)s::float8)
          AND bucket < to_timestamp((%(k0)s + g.i + 1) * %(step)s::float8)
        GROUP BY rank
    ) c"""
# Buckets as wide as the tier's rows (at 1,024 ranks every range: the row budget picks the
# tier that way) hold one row per rank each, whose mean is the grouped one to the bit (a
# sum of one row is that row; the rollups' buckets are multiples of their width from the
# epoch): one primary-key range read, no grouping (1h at 1,024 ranks: 55 ms, not 75).
_RANK_BUSY_ROWS = f"""SELECT rank, {_bucket("bucket")}, busy_sum / n {_ROLLED}"""


def run_rank_busy(*, run_id: int, start: float, end: float, max_points: int = 1000) -> RankBusy:
    """Each rank's mean busy time over [start, end) as a matrix (RankBusy), at the buckets
    and from the sources run_rank_history would read: its `busy` means (summed in another
    order, so perhaps an ulp apart). Two queries, whatever the rank count."""
    with transaction.atomic(using=read_alias(), savepoint=False):
        res, split = _plan_ranks(run_id, start, end, max_points=max_points)
        params, count, ts = _params(run_id, start, end, res=res, split=split)
        rolled = _RANK_BUSY_GROUPED
        if res.source != "raw" and res.step == TIERS[res.source][0]:
            rolled = _RANK_BUSY_ROWS
        sql = _RANK_BUSY_SQL.format(rolled=rolled).format(table=RANK_TABLES[res.source])
        with connections[read_alias()].cursor() as cursor:
            cursor.execute(sql, params)
            ranks, codes, means = (bytes(column) for column in cursor.fetchone())
    seen, rows = np.unique(np.frombuffer(ranks, ">i4"), return_inverse=True)
    codes_at = np.frombuffer(codes, ">i4").astype(np.int64)
    columns = np.where(codes_at >= 0, codes_at, -1 - codes_at)
    inside = columns < count  # and >= 0: the range's first bucket is index 0
    busy = np.full((len(seen), count), np.nan)
    reported = np.zeros((len(seen), count), dtype=bool)
    busy[rows[inside], columns[inside]] = np.frombuffer(means, ">f8")[inside]
    reported[rows[inside], columns[inside]] = codes_at[inside] >= 0
    return RankBusy(
        resolution_s=res.step, start=start, end=end, ts=ts, ranks=seen.tolist(), busy=busy,
        reported=reported,
    )  # fmt: skip
