"""Writes of history: dirty ranges at ingest, the rollup pass, rebuilds and retention.

Rollups (tables in migrations 0001 and 0003) hold per series (node, metric, gpu) one row per
minute and per hour (`history_sample_1m`, `_1h`: count, sum, min, max of samples); per run
and rank one row per 10 seconds, minute, 10 minutes and hour (`history_step_10s`, `_1m`,
`_10m`, `_1h`: count, sums, counts and maxima of step reports); per run, all ranks together,
one row per 10 seconds, minute and hour (`history_runstep_10s`, `_1m`, `_1h`). The SQL is
in `sql.py`. Ingest records the time range it wrote for each series and run in
`history_dirty_*` in its own transaction (`series_mark_dirty`, `runs_mark_dirty`), so a
committed raw write always leaves a dirty row behind it.
`rollups_refresh` claims dirty rows (DELETE … RETURNING, in its transaction), merges their
ranges into disjoint minute-aligned islands per series, recomputes those whole minute
buckets from raw data and then the coarser buckets containing them from the minutes.
Because buckets are recomputed from raw, never incremented, a re-run or a replay cannot
double count, and data arriving days late simply makes its buckets dirty again.

Every raw or rollup table is reached per island or hour through an OFFSET 0 lateral subquery
(a parameterized index scan): joined plainly, the planner may hash-join the claimed ranges
with a sequential scan of the whole table, on every pass.

Limits, by design: buckets older than the raw retention are not recomputed (their raw data
may be partly pruned; data that late is dropped from every tier), and hours older than the
1-minute retention are not either (their minutes may be gone).

Isolation: a round's statement that fails on its data (a sum out of range from rows stored
before the input bounds) is rolled back to a savepoint and the round redone from the same
claimed rows in halving groups of series or runs; the rows of a key that fails alone are set
aside (logged, counted in `RefreshResult.set_aside`), so one bad bucket never stops the
others or the watermark.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django import db
from django.conf import settings
from django.db import connection, transaction

from apps.core.copy import fixed_rows_binary
from apps.core.db import server_cursor
from apps.core.times import to_datetime
from apps.history.services.sealed import sealed_minutes_recompute
from apps.history.services.sql import (
    CLAIM_RUNS_SQL,
    CLAIM_SERIES_SQL,
    SAMPLE_HOURS_SQL,
    SAMPLE_MINUTES_GIVEN_SQL,
    SAMPLE_MINUTES_SQL,
    STEP_COARSER_SQL,
    STEP_MINUTES_GIVEN_SQL,
    STEP_MINUTES_SQL,
)
from apps.telemetry.chunk_copy import SeriesRanges

logger = logging.getLogger(__name__)

REFRESH_LOCK_KEY = 0x0B5C1
DAY_S = 86400


def series_mark_dirty(*, ranges: SeriesRanges) -> None:
    """Record the (node, metric, gpu, first ts, last ts) of each series just written; call in
    the transaction that wrote them. One binary COPY built by numpy: psycopg dumping these
    arrays element by element was a tenth of a drain's CPU."""
    if not len(ranges.node_ids):
        return
    stream = fixed_rows_binary(
        [("int4", ranges.node_ids), ("int4", ranges.metric_ids), ("int2", ranges.gpus),
         ("timestamptz", ranges.t0s), ("timestamptz", ranges.t1s)]
    )  # fmt: skip
    with (
        server_cursor() as cursor,
        cursor.copy(
            "COPY history_dirty_series (node_id, metric_id, gpu, t0, t1) FROM STDIN (FORMAT BINARY)"
        ) as copy,
    ):
        copy.write(stream)


def runs_mark_dirty(*, ranges: dict[int, tuple[datetime, datetime]]) -> None:
    """Record run id → (first ts, last ts) of step reports just written; call in the
    transaction that wrote them."""
    if not ranges:
        return
    run_ids = sorted(ranges)
    with server_cursor() as cursor:
        cursor.execute(
            "INSERT INTO history_dirty_run (run_id, t0, t1)"
            " SELECT * FROM unnest(%b::int8[], %b::timestamptz[], %b::timestamptz[])",
            [run_ids, [ranges[r][0] for r in run_ids], [ranges[r][1] for r in run_ids]],
        )


@dataclass
class RefreshResult:
    claimed: int = 0  # dirty rows consumed
    rounds: int = 0
    drained: bool = False  # the dirty tables were empty at the end (the watermark moved)
    set_aside: int = 0  # dirty rows whose buckets could not be recomputed (logged)


def rollups_refresh(*, claim_rows: int | None = None, max_rounds: int = 50) -> RefreshResult:
    """Recompute every minute and hour bucket that ingest marked dirty, from raw data.

    Idempotent and safe to run concurrently (a second caller returns at once). Each round
    is one transaction: claim ≤ claim_rows dirty rows per table, upsert their minutes, then
    their hours. When a round leaves nothing dirty, `history_watermark` moves to the round's
    start: every raw write committed before it is in the rollups (selectors read raw data
    after it)."""
    claim_rows = claim_rows or settings.HISTORY_ROLLUP_CLAIM_ROWS
    result = RefreshResult()
    floors = _refresh_floors(now=time.time())
    for _ in range(max_rounds):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s), now()", [REFRESH_LOCK_KEY])
            locked, round_started = cursor.fetchone()
            if not locked:
                return result
            claimed, set_aside = _round(_SAMPLES, limit=claim_rows, floors=floors)
            claimed_runs, set_aside_runs = _round(_STEPS, limit=claim_rows, floors=floors)
            result.claimed += claimed + claimed_runs
            result.set_aside += set_aside + set_aside_runs
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


# Errors of the data (a sum out of range from values stored before the input bounds, say):
# recomputing the same buckets fails again. Any other error fails the pass, to be rerun.
ROLLUP_DATA_ERRORS = (db.DataError, psycopg.DataError)


@dataclass(frozen=True)
class _Source:
    """One kind of dirty row (sample series or runs): how a round claims and recomputes its
    buckets, and how the rows of a claimed round are redone a key at a time."""

    what: str  # for the log
    minutes_sql: str  # claims up to %(limit)s dirty rows and recomputes their minutes
    claim_sql: str  # claims them only (for isolation)
    given_sql: str  # recomputes the minutes of the given rows
    columns: tuple[str, ...]  # the given rows' columns, as parameters of given_sql
    key_length: int  # the leading columns that name a key (a series, a run)
    coarser: Callable[[Any, tuple, dict[str, float]], None]  # coarser tiers of a result


def _sample_hours(cursor: Any, result: tuple, floors: dict[str, float]) -> None:
    """The hours of the minutes just written, after the minutes of islands holding sealed
    chunks were recomputed (their points are encoded: see sealed.py)."""
    hours = set(zip(*result[1:5], strict=True)) if result[1] else set()
    for node_id, metric_id, gpu, hour in sealed_minutes_recompute(cursor, islands=result[5]):
        hours.add((node_id, metric_id, gpu, to_datetime(hour)))
    if hours:
        columns = [list(column) for column in zip(*sorted(hours), strict=True)]
        cursor.execute(SAMPLE_HOURS_SQL, [*columns, floors["hour"]])


def _step_tiers(cursor: Any, result: tuple, floors: dict[str, float]) -> None:
    if result[1]:
        cursor.execute(
            STEP_COARSER_SQL, {"runs": result[1], "hours": result[2], "floor": floors["hour"]}
        )


_SAMPLES = _Source(
    "series",
    SAMPLE_MINUTES_SQL,
    CLAIM_SERIES_SQL,
    SAMPLE_MINUTES_GIVEN_SQL,
    ("node_ids", "metric_ids", "gpus", "t0s", "t1s"),
    3,
    _sample_hours,
)
_STEPS = _Source(
    "runs",
    STEP_MINUTES_SQL,
    CLAIM_RUNS_SQL,
    STEP_MINUTES_GIVEN_SQL,
    ("run_ids", "t0s", "t1s"),
    1,
    _step_tiers,
)


def _round(source: _Source, *, limit: int, floors: dict[str, float]) -> tuple[int, int]:
    """(dirty rows claimed, of which set aside)."""
    try:
        with transaction.atomic():
            return _rollup(source, source.minutes_sql, {"limit": limit}, floors=floors), 0
    except ROLLUP_DATA_ERRORS as exc:
        logger.warning("rollup round of %s failed, isolating them: %s", source.what, exc)
    with server_cursor() as cursor:
        cursor.execute(source.claim_sql, {"limit": limit})
        claimed = cursor.fetchall()

    def rollup(rows: list[tuple]) -> None:
        _rollup(source, source.given_sql, _columns(rows, names=source.columns), floors=floors)

    set_aside = _rollup_isolated(
        rows=claimed, key=lambda row: row[: source.key_length], rollup=rollup
    )
    return len(claimed), set_aside


def _rollup(source: _Source, sql: str, params: dict, *, floors: dict[str, float]) -> int:
    """Recompute the minutes `sql` names, then their coarser tiers; returns rows claimed."""
    with server_cursor() as cursor:
        cursor.execute(sql, {**params, "floor": floors["minute"]})
        result = cursor.fetchone()
        source.coarser(cursor, result, floors)
    return result[0]


def _columns(rows: list[tuple], *, names: tuple[str, ...]) -> dict[str, list]:
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


def _rollup_isolated(
    *, rows: list[tuple], key: Callable[[tuple], Hashable], rollup: Callable[[list[tuple]], None]
) -> int:
    """Roll up claimed dirty rows a group of keys at a time, each group in a savepoint,
    halving a group that fails on its data: every good key's buckets are recomputed in a few
    statements, and the rows of a key that fails alone are set aside (logged with the
    error) so that the pass, and the watermark, go on. Returns the rows set aside."""
    by_key: dict[Hashable, list[tuple]] = defaultdict(list)
    for row in rows:
        by_key[key(row)].append(row)
    groups = list(by_key.values())
    pending = [groups[: len(groups) // 2], groups[len(groups) // 2 :]]  # the whole just failed
    set_aside = 0
    while pending:
        part = pending.pop()
        if not part:
            continue
        try:
            with transaction.atomic():
                rollup([row for group in part for row in group])
        except ROLLUP_DATA_ERRORS as exc:
            if len(part) > 1:
                pending += [part[: len(part) // 2], part[len(part) // 2 :]]
                continue
            set_aside += len(part[0])
            first, last = min(r[-2] for r in part[0]), max(r[-1] for r in part[0])
            logger.warning(
                "rollup of %s from %s to %s set aside: %s", key(part[0][0]), first, last, exc
            )
    return set_aside


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


# Retention lives in its own module; these names are where callers have always found them.
from apps.history.services.retention import (  # noqa: E402
    PruneTarget,
    history_prune,
    partitions_maintain,
    table_prune,
)

__all__ = [
    "PruneTarget",
    "history_prune",
    "partitions_maintain",
    "rollups_rebuild",
    "rollups_refresh",
    "runs_mark_dirty",
    "series_mark_dirty",
    "table_prune",
]
