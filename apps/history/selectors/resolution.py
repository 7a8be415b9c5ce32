"""Which resolution and source serve a range, and where rollup data ends and raw begins."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from django.db import connection

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
class Resolution:
    step: float  # bucket width in seconds; 0: raw points
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


@dataclass(frozen=True)
class Split:
    """Rollup rows with bucket in [roll_lo, roll_hi), raw data in [raw_lo, end)."""

    roll_lo: float
    roll_hi: float
    raw_lo: float


def range_split(*, start: float, end: float, res: Resolution) -> Split:
    """Where the rollup stops and raw data takes over: whole buckets up to the last rollup
    pass less a margin (one query, for rollup sources only). Passed to SQL as constants, so
    that the planner bounds every index scan by them, prepared or not."""
    if res.source == "raw":
        return Split(roll_lo=start, roll_hi=start, raw_lo=start)
    roll_lo = math.floor(start / res.step) * res.step
    rolled_up_at = watermark_get()
    if rolled_up_at is None:
        return Split(roll_lo=roll_lo, roll_hi=roll_lo, raw_lo=start)
    split = math.floor((rolled_up_at - ROLLUP_FRESH_MARGIN_S) / res.step) * res.step
    return Split(
        roll_lo=roll_lo,
        roll_hi=min(end, max(roll_lo, split)),
        raw_lo=max(start, min(end, split)),
    )


def watermark_get() -> float | None:
    """When the last rollup pass that drained every dirty range started (epoch seconds)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM rolled_up_at)::float8 FROM history_watermark WHERE id = 1"
        )
        row = cursor.fetchone()
    return row[0] if row else None
