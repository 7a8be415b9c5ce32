"""The pages' time ranges: the picker's keys, an absolute ?from=&to= range, and the moment
a range's point-in-time figures are computed at."""

from __future__ import annotations

import math
from dataclasses import dataclass

# The range picker: key → seconds back from the end; "all" is the whole run (or, for a
# node, the contract's 7 days of history).
RANGES: dict[str, int | None] = {"15m": 900, "1h": 3600, "6h": 21_600, "24h": 86_400, "all": None}
NODE_HISTORY_S = 7 * 86_400
FUTURE_SLACK_S = 300  # the contract accepts ts up to 5 minutes ahead
CUSTOM_RANGE = "custom"  # an absolute range: ?from=&to= (a zoom, a shared link)
MIN_SPAN_S = 10.0
MAX_SPAN_S = 31 * 86_400


@dataclass(frozen=True)
class TimeRange:
    key: str
    start: float
    end: float


class RangeInvalid(ValueError):
    pass


def time_range(*, key: str, now: float, began: float | None = None) -> TimeRange:
    """The picker's range up to now; "all" starts when the run `began` (run_began; a node's
    "all": NODE_HISTORY_S ago). The
    end reaches FUTURE_SLACK_S past now, as the contract accepts: an agent whose clock runs a
    little ahead must not have its newest points hidden."""
    if key not in RANGES:
        raise RangeInvalid(f"must be one of {', '.join(RANGES)}")
    seconds = RANGES[key]
    end = now + FUTURE_SLACK_S
    if seconds is not None:
        return TimeRange(key, now - seconds, end)
    start = began if began is not None else now - NODE_HISTORY_S
    return TimeRange(key, min(start, now - 60), end)


def time_range_between(*, start: float, end: float) -> TimeRange:
    """An absolute range (a zoom, or a shared link's ?from=&to=): key "custom". Refused
    unless MIN_SPAN_S <= end - start <= MAX_SPAN_S (a chart of a few seconds has no bucket,
    one of years reads every rollup)."""
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RangeInvalid("from and to must be finite times")
    if not MIN_SPAN_S <= end - start <= MAX_SPAN_S:
        raise RangeInvalid(f"to - from must be {MIN_SPAN_S:.0f} s to {MAX_SPAN_S // 86_400} days")
    return TimeRange(CUSTOM_RANGE, start, end)


def as_of(tr: TimeRange, now: float) -> float:
    """The moment a range's point-in-time figures (goodput) are computed at: its end, but
    never past now (a range reaches FUTURE_SLACK_S ahead for early clocks' points, and the
    future holds no wall time to count)."""
    return min(tr.end, now)
