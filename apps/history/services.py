"""Writes of history: dirty ranges at ingest, the rollup pass, rebuilds and retention.

Rollups (tables in migration 0001) hold, per series (node, metric, gpu) and per run/rank,
one row per minute (`*_1m`) and per hour (`*_1h`): count, sum, min, max of samples; count,
sums, counts and maxima of step reports. Ingest records the time range it wrote for each
series and run in `history_dirty_*` in its own transaction (`series_mark_dirty`,
`runs_mark_dirty`), so a committed raw write always leaves a dirty row behind it.
`rollups_refresh` claims dirty rows (DELETE … RETURNING, in its transaction), merges their
ranges into disjoint minute-aligned islands per series, recomputes those whole minute
buckets from raw data and then the hours containing them from the minutes, upserting both.
Because buckets are recomputed from raw, never incremented, a re-run or a replay cannot
double count, and data arriving days late simply makes its buckets dirty again.

Every raw or rollup table is reached per island or hour through an OFFSET 0 lateral subquery
(a parameterized index scan): joined plainly, the planner may hash-join the claimed ranges
with a sequential scan of the whole table, on every pass.

Limits, by design: buckets older than the raw retention are not recomputed (their raw data
may be partly pruned; data that late is dropped from every tier), and hours older than the
1-minute retention are not either (their minutes may be gone).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from opsboard.db import server_cursor

logger = logging.getLogger(__name__)

REFRESH_LOCK_KEY = 0x0B5C1
DAY_S = 86400


def series_mark_dirty(*, ranges: list[tuple[int, int, int, datetime, datetime]]) -> None:
    """Record (node id, metric id, gpu, first ts, last ts) of samples just written; call in
    the transaction that wrote them."""
    if not ranges:
        return
    columns = list(zip(*ranges, strict=True))
    with server_cursor() as cursor:
        cursor.execute(
            "INSERT INTO history_dirty_series (node_id, metric_id, gpu, t0, t1)"
            " SELECT * FROM unnest(%s::int4[], %s::int4[], %s::int2[],"
            " %s::timestamptz[], %s::timestamptz[])",
            [list(column) for column in columns],
        )


def runs_mark_dirty(*, ranges: dict[int, tuple[datetime, datetime]]) -> None:
    """Record run id → (first ts, last ts) of step reports just written; call in the
    transaction that wrote them."""
    if not ranges:
        return
    run_ids = sorted(ranges)
    with server_cursor() as cursor:
        cursor.execute(
            "INSERT INTO history_dirty_run (run_id, t0, t1)"
            " SELECT * FROM unnest(%s::int8[], %s::timestamptz[], %s::timestamptz[])",
            [run_ids, [ranges[r][0] for r in run_ids], [ranges[r][1] for r in run_ids]],
        )


# Claimed ranges → disjoint islands of whole minutes per key, in epoch seconds. A range
# starting at or before the running end of the earlier ones of its key joins their island.
_ISLANDS = """
ranges AS (
    SELECT {key}, greatest(floor(extract(epoch FROM t0)::float8 / 60) * 60, %(floor)s) AS lo,
           floor(extract(epoch FROM t1)::float8 / 60) * 60 + 60 AS hi
    FROM claimed WHERE extract(epoch FROM t1)::float8 >= %(floor)s
), flagged AS (
    SELECT *, CASE WHEN lo <= max(hi) OVER (PARTITION BY {key} ORDER BY lo, hi
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS starts
    FROM ranges
), numbered AS (
    SELECT *, sum(starts) OVER (PARTITION BY {key} ORDER BY lo, hi ROWS UNBOUNDED PRECEDING)
              AS island
    FROM flagged
), islands AS (
    SELECT {key}, min(lo) AS lo, max(hi) AS hi FROM numbered GROUP BY {key}, island
)"""

_CLAIM = """
claimed AS (
    DELETE FROM {table}
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} LIMIT %(limit)s))
    RETURNING *
)"""

# Touched hours come back as arrays for the second statement (which must see these minutes).
_HOURS_RETURNED = """
SELECT (SELECT count(*) FROM claimed), {arrays}
FROM (SELECT DISTINCT {key}, date_trunc('hour', bucket) AS hour FROM upserted) h
"""

SERIES_KEY = "node_id, metric_id, gpu"
_SAMPLE_MINUTES_SQL = f"""
WITH {_CLAIM.format(table="history_dirty_series")},
{_ISLANDS.format(key=SERIES_KEY)},
chunks AS (
    SELECT i.node_id, i.metric_id, i.gpu, i.lo * 1000 AS lo_ms, i.hi * 1000 AS hi_ms,
           extract(epoch FROM c.t0)::float8 * 1000 AS e0_ms, c.offsets_ms, c.vals
    FROM islands i CROSS JOIN LATERAL (
        SELECT t0, offsets_ms, vals FROM telemetry_chunk c
        WHERE c.node_id = i.node_id AND c.metric_id = i.metric_id AND c.gpu = i.gpu
          AND c.t0 < to_timestamp(i.hi) AND c.t1 >= to_timestamp(i.lo)
          -- an uncompacted chunk holds one batch: it never starts long before its points
          AND c.t0 >= to_timestamp(i.lo) - interval '1 day'
        OFFSET 0
    ) c
), minutes AS (
    SELECT node_id, metric_id, gpu, floor((e0_ms + u.o) / 60000) AS k, count(*) AS n,
           sum(u.v) AS vsum, min(u.v) AS vmin, max(u.v) AS vmax
    FROM chunks CROSS JOIN LATERAL unnest(chunks.offsets_ms, chunks.vals) AS u(o, v)
    WHERE e0_ms + u.o >= lo_ms AND e0_ms + u.o < hi_ms
    GROUP BY node_id, metric_id, gpu, k
), upserted AS (
    INSERT INTO history_sample_1m AS r (node_id, metric_id, gpu, bucket, n, vsum, vmin, vmax)
    SELECT node_id, metric_id, gpu, to_timestamp(k * 60), n, vsum, vmin, vmax FROM minutes
    ON CONFLICT (node_id, metric_id, gpu, bucket) DO UPDATE SET
        n = EXCLUDED.n, vsum = EXCLUDED.vsum, vmin = EXCLUDED.vmin, vmax = EXCLUDED.vmax
    RETURNING node_id, metric_id, gpu, bucket
)
{
    _HOURS_RETURNED.format(
        key=SERIES_KEY,
        arrays="array_agg(node_id), array_agg(metric_id), array_agg(gpu), array_agg(hour)",
    )
}"""

_SAMPLE_HOURS_SQL = """
INSERT INTO history_sample_1h (node_id, metric_id, gpu, bucket, n, vsum, vmin, vmax)
SELECT h.node_id, h.metric_id, h.gpu, h.hour, sum(m.n), sum(m.vsum), min(m.vmin), max(m.vmax)
FROM unnest(%s::int4[], %s::int4[], %s::int2[], %s::timestamptz[]) AS h(node_id, metric_id, gpu,
                                                                           hour)
CROSS JOIN LATERAL (
    SELECT n, vsum, vmin, vmax FROM history_sample_1m m
    WHERE m.node_id = h.node_id AND m.metric_id = h.metric_id AND m.gpu = h.gpu
      AND m.bucket >= h.hour AND m.bucket < h.hour + interval '1 hour'
    OFFSET 0
) m
WHERE h.hour >= to_timestamp(%s)
GROUP BY h.node_id, h.metric_id, h.gpu, h.hour
ON CONFLICT (node_id, metric_id, gpu, bucket) DO UPDATE SET
    n = EXCLUDED.n, vsum = EXCLUDED.vsum, vmin = EXCLUDED.vmin, vmax = EXCLUDED.vmax
"""

# Step rollups: (sum, count) per optional stage so means skip reports that left it out.
STEP_SUMS = ("data_time", "h2d_time", "compute_time", "comm_wait")
STEP_COLUMNS = (
    "n, max_step, step_time_sum, step_time_max, tokens_sum, loss_sum, loss_n, "
    + ", ".join(f"{stage}_sum, {stage}_n" for stage in STEP_SUMS)
)
_STEP_RAW_AGGREGATES = (
    "count(*), max(step), sum(step_time), max(step_time), sum(tokens), sum(loss), count(loss), "
    + ", ".join(f"sum({stage}), count({stage})" for stage in STEP_SUMS)
)
_STEP_ROLLUP_AGGREGATES = (
    "sum(n), max(max_step), sum(step_time_sum), max(step_time_max), sum(tokens_sum), "
    "sum(loss_sum), sum(loss_n), "
    + ", ".join(f"sum({stage}_sum), sum({stage}_n)" for stage in STEP_SUMS)
)
_STEP_UPDATE = ", ".join(f"{c} = EXCLUDED.{c}" for c in STEP_COLUMNS.split(", "))

_STEP_MINUTES_SQL = f"""
WITH {_CLAIM.format(table="history_dirty_run")},
{_ISLANDS.format(key="run_id")},
upserted AS (
    INSERT INTO history_step_1m (run_id, rank, bucket, {STEP_COLUMNS})
    SELECT s.run_id, s.rank, date_trunc('minute', s.ts), {_STEP_RAW_AGGREGATES}
    FROM islands i CROSS JOIN LATERAL (
        SELECT * FROM runs_stepreport s
        WHERE s.run_id = i.run_id AND s.ts >= to_timestamp(i.lo) AND s.ts < to_timestamp(i.hi)
        OFFSET 0
    ) s
    GROUP BY s.run_id, s.rank, date_trunc('minute', s.ts)
    ON CONFLICT (run_id, bucket, rank) DO UPDATE SET {_STEP_UPDATE}
    RETURNING run_id, bucket
)
{_HOURS_RETURNED.format(key="run_id", arrays="array_agg(run_id), array_agg(hour)")}"""

_STEP_HOURS_SQL = f"""
INSERT INTO history_step_1h (run_id, rank, bucket, {STEP_COLUMNS})
SELECT h.run_id, m.rank, h.hour, {_STEP_ROLLUP_AGGREGATES}
FROM unnest(%s::int8[], %s::timestamptz[]) AS h(run_id, hour)
CROSS JOIN LATERAL (
    SELECT * FROM history_step_1m m
    WHERE m.run_id = h.run_id AND m.bucket >= h.hour AND m.bucket < h.hour + interval '1 hour'
    OFFSET 0
) m
WHERE h.hour >= to_timestamp(%s)
GROUP BY h.run_id, m.rank, h.hour
ON CONFLICT (run_id, bucket, rank) DO UPDATE SET {_STEP_UPDATE}
"""


@dataclass
class RefreshResult:
    claimed: int = 0  # dirty rows consumed
    rounds: int = 0
    drained: bool = False  # the dirty tables were empty at the end (the watermark moved)


def rollups_refresh(*, claim_rows: int = 20_000, max_rounds: int = 50) -> RefreshResult:
    """Recompute every minute and hour bucket that ingest marked dirty, from raw data.

    Idempotent and safe to run concurrently (a second caller returns at once). Each round
    is one transaction: claim ≤ claim_rows dirty rows per table, upsert their minutes, then
    their hours. When a round leaves nothing dirty, `history_watermark` moves to the round's
    start: every raw write committed before it is in the rollups (selectors read raw data
    after it)."""
    result = RefreshResult()
    floors = _refresh_floors(now=time.time())
    for _ in range(max_rounds):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s), now()", [REFRESH_LOCK_KEY])
            locked, round_started = cursor.fetchone()
            if not locked:
                return result
            claimed = _samples_round(limit=claim_rows, floors=floors)
            claimed_runs = _steps_round(limit=claim_rows, floors=floors)
            result.claimed += claimed + claimed_runs
            result.rounds += 1
            if claimed < claim_rows and claimed_runs < claim_rows:
                _watermark_set(at=round_started)
                result.drained = True
                return result
    return result


def _refresh_floors(*, now: float) -> dict[str, float]:
    """Epoch seconds before which minutes (raw retention) and hours (1-minute retention)
    are not recomputed: their sources may already be partly pruned."""
    raw_days = settings.HISTORY_RAW_RETENTION_DAYS
    minute_days = settings.HISTORY_1M_RETENTION_DAYS
    minute_floor = -(-(now - raw_days * DAY_S) // 60) * 60 if raw_days else 0.0
    hour_floor = -(-(now - minute_days * DAY_S) // 3600) * 3600 if minute_days else 0.0
    return {"minute": minute_floor, "hour": hour_floor}


def _samples_round(*, limit: int, floors: dict[str, float]) -> int:
    with server_cursor() as cursor:
        cursor.execute(_SAMPLE_MINUTES_SQL, {"limit": limit, "floor": floors["minute"]})
        claimed, *hours = cursor.fetchone()
        if hours[0]:
            cursor.execute(_SAMPLE_HOURS_SQL, [*hours, floors["hour"]])
    return claimed


def _steps_round(*, limit: int, floors: dict[str, float]) -> int:
    with server_cursor() as cursor:
        cursor.execute(_STEP_MINUTES_SQL, {"limit": limit, "floor": floors["minute"]})
        claimed, *hours = cursor.fetchone()
        if hours[0]:
            cursor.execute(_STEP_HOURS_SQL, [*hours, floors["hour"]])
    return claimed


def _watermark_set(*, at: datetime) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO history_watermark (id, rolled_up_at) VALUES (1, %s)"
            " ON CONFLICT (id) DO UPDATE SET rolled_up_at = EXCLUDED.rolled_up_at",
            [at],
        )


def rollups_rebuild(*, start: datetime, end: datetime, window: timedelta) -> RefreshResult:
    """Mark all raw data in [start, end) dirty, one window at a time, and refresh after
    each window (for data stored before this app existed, or after a restore)."""
    total = RefreshResult()
    cursor_at = start
    while cursor_at < end:
        upto = min(cursor_at + window, end)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_MARK_SERIES_SQL, {"start": cursor_at, "end": upto})
            cursor.execute(_MARK_RUNS_SQL, {"start": cursor_at, "end": upto})
        result = rollups_refresh(claim_rows=1_000_000, max_rounds=1_000)
        total.claimed += result.claimed
        total.rounds += result.rounds
        total.drained = result.drained
        cursor_at = upto
    return total


_MARK_SERIES_SQL = """
INSERT INTO history_dirty_series (node_id, metric_id, gpu, t0, t1)
SELECT node_id, metric_id, gpu, greatest(min(t0), %(start)s), least(max(t1), %(end)s)
FROM telemetry_chunk WHERE t0 < %(end)s AND t1 >= %(start)s
  AND t0 >= %(start)s::timestamptz - interval '1 day'
GROUP BY node_id, metric_id, gpu
"""
_MARK_RUNS_SQL = """
INSERT INTO history_dirty_run (run_id, t0, t1)
SELECT run_id, min(ts), max(ts) FROM runs_stepreport WHERE ts >= %(start)s AND ts < %(end)s
GROUP BY run_id
"""


@dataclass(frozen=True)
class PruneTarget:
    table: str
    expired: str  # SQL condition on %(cutoff)s; must be able to use the table's BRIN index
    retention_setting: str


PRUNE_TARGETS = (
    PruneTarget("telemetry_chunk", "t0 < %(cutoff)s AND t1 < %(cutoff)s", "RAW"),
    PruneTarget("runs_stepreport", "ts < %(cutoff)s", "RAW"),
    PruneTarget("history_sample_1m", "bucket < %(cutoff)s", "1M"),
    PruneTarget("history_step_1m", "bucket < %(cutoff)s", "1M"),
    PruneTarget("history_sample_1h", "bucket < %(cutoff)s", "1H"),
    PruneTarget("history_step_1h", "bucket < %(cutoff)s", "1H"),
)


def history_prune(*, now: datetime) -> dict[str, int]:
    """Delete rows older than their resolution's retention (HISTORY_<RAW|1M|1H>_RETENTION_DAYS;
    0 keeps them forever), in batches of HISTORY_PRUNE_BATCH rows, a transaction each, at
    most HISTORY_PRUNE_MAX_BATCHES per table per call. Returns rows deleted per table."""
    deleted: dict[str, int] = {}
    for target in PRUNE_TARGETS:
        days = getattr(settings, f"HISTORY_{target.retention_setting}_RETENTION_DAYS")
        if days:
            deleted[target.table] = _prune_table(target=target, cutoff=now - timedelta(days=days))
    return deleted


def _prune_table(*, target: PruneTarget, cutoff: datetime) -> int:
    batch = settings.HISTORY_PRUNE_BATCH
    sql = (
        f"DELETE FROM {target.table} WHERE ctid = ANY(ARRAY("
        f"SELECT ctid FROM {target.table} WHERE {target.expired} LIMIT %(batch)s))"
    )
    total = 0
    for _ in range(settings.HISTORY_PRUNE_MAX_BATCHES):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, {"cutoff": cutoff, "batch": batch})
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch:
            break
    if total:
        logger.info("pruned %s rows of %s older than %s", total, target.table, cutoff)
    return total
