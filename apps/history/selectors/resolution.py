"""Which resolution and source serve a range, and where rollup data ends and raw begins."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from django.db import connections

from apps.core.db_router import read_alias

# Agents sample at 1 Hz: a range of up to max_points seconds is shown as raw points.
RAW_SAMPLE_INTERVAL_S = 1.0
# Bucket widths, in seconds: multiples of a rollup tier's width are read from it, the rest
# from raw data. 20 s and 20 minutes rather than 15: multiples of the 10 s and 10-minute tiers.
LADDER_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 10800, 21600, 43200)
MINUTE, HOUR, DAY = 60, 3600, 86400
# Most raw points (or step reports) one request may read when it buckets raw data: a wider
# request (many series over hours) is served from the 1-minute rollup instead, with fewer
# than max_points buckets. ≈ 0.1 s of server time at ~5 M points/s.
RAW_POINT_BUDGET = 500_000
# Most rollup rows (ranks × buckets) a per-rank read (the run page's heat-map, its JSON and
# the straggler evidence) may read before a coarser tier serves it: at 1,024 ranks an hour of
# 10-second rows is 368 k (≈ 220 ms of SQL), of minutes 61 k (≈ 86 ms), so the hour shows
# one-minute columns, not 30-second ones. Below ~400 ranks nothing changes.
RANK_ROLLUP_ROW_BUDGET = 150_000
# Buckets ending this long before the last rollup pass are read from the rollup, later ones
# from raw data: covers the agents' batching delay (≤ 10 s) and data in flight at the pass.
ROLLUP_FRESH_MARGIN_S = 60

Source = Literal["raw", "10s", "1m", "10m", "1h"]
# Rollup tiers: bucket width and the setting that holds its retention.
TIERS: dict[str, tuple[int, str]] = {
    "10s": (10, "HISTORY_10S_RETENTION_DAYS"),
    "1m": (MINUTE, "HISTORY_1M_RETENTION_DAYS"),
    "10m": (600, "HISTORY_10M_RETENTION_DAYS"),
    "1h": (HOUR, "HISTORY_1H_RETENTION_DAYS"),
}
SAMPLE_TIERS = ("1m", "1h")
STEP_TIERS = ("10s", "1m", "10m", "1h")  # per rank
RUN_STEP_TIERS = ("10s", "1m", "1h")  # per run: 72 hours of minutes are 4,320 rows


@dataclass(frozen=True)
class Resolution:
    step: float  # bucket width in seconds; 0: raw points
    source: Source


def resolution_choose(
    *,
    start: float,
    end: float,
    max_points: int,
    now: float,
    raw_points: bool = True,
    series: int = 1,
    tiers: tuple[str, ...] = SAMPLE_TIERS,
    row_budget: int = RAW_POINT_BUDGET,
    tier_series: int | None = None,
) -> Resolution:
    """The finest bucket width giving at most ~max_points buckets over [start, end), read
    from the coarsest of `tiers` that divides it and whose retention still covers `start`;
    else from raw data while `series` series (at 1 Hz) stay within RAW_POINT_BUDGET points
    and the raw retention covers `start`; else from the finest covering tier, widened to
    a multiple of its width. A tier whose rows (tier_series × span ÷ width; tier_series
    defaults to `series`, the run-level step tiers hold one row per bucket) would exceed
    `row_budget` is passed over for a coarser one."""
    rows_per_bucket = series if tier_series is None else tier_series
    span = max(end - start, 1.0)
    if raw_points and span <= max_points * RAW_SAMPLE_INTERVAL_S:
        return Resolution(step=0, source="raw")
    wanted = span / max(max_points, 1)
    step = next((s for s in LADDER_S if s >= wanted), math.ceil(wanted / DAY) * DAY)
    covering = [
        name for name in tiers if not _expired(start, now, getattr(settings, TIERS[name][1]))
    ] or [tiers[-1]]

    def within_budget(width: float, budget: int = row_budget, per: int = rows_per_bucket) -> bool:
        return max(per, 1) * span / width <= budget

    for name in reversed(covering):  # coarsest first: the fewest rows to read
        width = TIERS[name][0]
        if step % width == 0 and within_budget(width):
            return Resolution(step=step, source=name)  # type: ignore[arg-type]
    if (
        step < MINUTE
        and within_budget(RAW_SAMPLE_INTERVAL_S, RAW_POINT_BUDGET, series)
        and not _expired(start, now, settings.HISTORY_RAW_RETENTION_DAYS)
    ):
        return Resolution(step=step, source="raw")
    for name in covering:  # the finest tier within the budget, at a width it divides
        width = TIERS[name][0]
        if within_budget(width) or name == covering[-1]:
            widened = math.ceil(step / width) * width
            return Resolution(step=widened, source=name)  # type: ignore[arg-type]
    raise AssertionError("unreachable: the last covering tier is always chosen")


def _expired(ts: float, now: float, retention_days: float) -> bool:
    return bool(retention_days) and ts < now - retention_days * DAY


@dataclass(frozen=True)
class Split:
    """Rollup rows with bucket in [roll_lo, roll_hi), raw data in [raw_lo, end)."""

    roll_lo: float
    roll_hi: float
    raw_lo: float


def range_split(*, start: float, end: float, res: Resolution, rolled_up_at: float | None) -> Split:
    """Where the rollup stops and raw data takes over: whole buckets up to the last rollup
    pass (`rolled_up_at`, see history_meta) less a margin. Passed to SQL as constants, so
    that the planner bounds every index scan by them, prepared or not."""
    if res.source == "raw":
        return Split(roll_lo=start, roll_hi=start, raw_lo=start)
    roll_lo = math.floor(start / res.step) * res.step
    if rolled_up_at is None:
        return Split(roll_lo=roll_lo, roll_hi=roll_lo, raw_lo=start)
    split = math.floor((rolled_up_at - ROLLUP_FRESH_MARGIN_S) / res.step) * res.step
    return Split(
        roll_lo=roll_lo,
        roll_hi=min(end, max(roll_lo, split)),
        raw_lo=max(start, min(end, split)),
    )


# Set by the meta query for the selector's transaction only (set_config(…, true)), so that
# they apply to its data query: JIT compiled the bigger reads for up to a second, longer than
# they then ran, and the default 4 MB work_mem spilled their aggregation and sorts to disk.
READ_SETTINGS = {"jit": "off", "work_mem": "32MB"}
_SET_READ_SETTINGS = ", ".join(f"set_config('{k}', '{v}', true)" for k, v in READ_SETTINGS.items())


def history_meta(*, count_sql: str, params: list) -> tuple[float | None, int]:
    """One query: when the last rollup pass that drained every dirty range started (epoch
    seconds, None before the first), and the count `count_sql` gives (series or ranks).
    Also applies READ_SETTINGS to the rest of the transaction: call it in the selector's
    `transaction.atomic()`, before the data query."""
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            f"SELECT {_SET_READ_SETTINGS},"
            " (SELECT extract(epoch FROM rolled_up_at)::float8 FROM history_watermark"
            f" WHERE id = 1), ({count_sql})",
            params,
        )
        *_, rolled_up_at, count = cursor.fetchone()
    return rolled_up_at, int(count or 0)
