"""Conditions that hold "for a span" of a telemetry series, judged on a share of its samples
so that one stray sample neither makes nor breaks them: the points form (`sustained`, the
reference) and the columnar ones the detectors use (`sustained_where`, `sustained_tails`),
with the comparisons they take as `met_of`."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
from numpy.typing import NDArray

from detectors.types import FloatColumn, Series

_TIME = itemgetter(0)  # of a (ts, value) point


def sustained(
    points: Sequence[tuple[float, float]],
    condition: Callable[[float], object],
    span: float,
    share: float,
) -> float | None:
    """When a condition that must hold "for `span` seconds" began, or None when it does not
    hold now. It holds when the series reaches back `span` seconds from its newest point and
    at least `share` of the samples of those seconds meet it: one stray sample (jitter, a
    dropped reading) neither makes nor breaks it, where requiring every sample would. The
    start is the first meeting sample of the longest trailing stretch that keeps `share`."""
    if not points or points[-1][0] - points[0][0] < span:
        return None
    end = points[-1][0]
    start = bisect_left(points, end - span, key=_TIME)
    recent = points[start:]
    if sum(1 for _, v in recent if condition(v)) < share * len(recent):
        return None
    since, met = None, 0
    for seen, (ts, value) in enumerate(reversed(points), start=1):
        if condition(value):
            met += 1
            if met >= share * seen:
                since = ts
    return since


def sustained_met(
    times: FloatColumn, met: NDArray[np.bool_], span: float, share: float
) -> float | None:
    """`sustained` over a series' columns: `met` says which of its samples meet the
    condition (a vectorised comparison of its values). The same answer, in numpy: a series
    of 600 points costs a few array operations rather than a Python call per point."""
    return sustained_where(times, met, _itself, span, share)


def sustained_where(
    times: FloatColumn,
    values: NDArray[Any],
    met_of: Callable[[NDArray[Any]], NDArray[np.bool_]],
    span: float,
    share: float,
) -> float | None:
    """`sustained_met` with the condition given as `met_of(values)`, judged first on the
    samples of the last `span` only: a healthy GPU's series (nearly all of them, every
    pass) costs a comparison of those, not of its whole window."""
    n = len(times)
    if not n or times[-1] - times[0] < span:
        return None
    start = int(np.searchsorted(times, times[-1] - span, side="left"))
    if np.count_nonzero(met_of(values[start:])) < share * (n - start):
        return None
    newest_first = met_of(values)[::-1]
    # the newest `seen` samples keep the share where the running count of met ones does
    seen = np.arange(1, n + 1)
    kept = newest_first & (np.cumsum(newest_first) >= share * seen)
    hits = np.flatnonzero(kept)
    return times[n - 1 - hits[-1]].item() if hits.size else None


def sustained_tails(
    series: Sequence[Series],
    met_of: Callable[[NDArray[Any]], NDArray[np.bool_]],
    span: float,
    share: float,
) -> list[bool]:
    """For each series, whether `sustained_where` over it passes its first test (the series
    reaches back `span` and the samples of its last `span` keep `share`): where this says
    False, sustained_where says None. One `met_of` over every series' tail at once, so that
    a detector walks only the GPUs that may raise something: at 16,384 GPUs, a call per
    series (≈ 25 µs) was most of thermal's pass."""
    [passed] = sustained_tails_each(series, [(met_of, span)], share)
    return passed


def sustained_tails_each(
    series: Sequence[Series],
    conditions: Sequence[tuple[Callable[[NDArray[Any]], NDArray[np.bool_]], float]],
    share: float,
) -> list[list[bool]]:
    """`sustained_tails` of each (met_of, span) of `conditions` over the same series: the
    tails of each span are found and joined once for all its conditions (thermal's throttle
    and power-cap tests read the same 300 s of every GPU's throttle mask: at 16,384 GPUs,
    finding and joining those tails was ≈ 60 ms a call)."""
    out = [[False] * len(series) for _ in conditions]
    for span in dict.fromkeys(span for _, span in conditions):
        long_enough, offsets, lengths, joined = _tails(series, span)
        if not long_enough:
            continue
        for passed, (met_of, of_span) in zip(out, conditions, strict=True):
            if of_span != span:
                continue
            met = np.add.reduceat(met_of(joined).astype(np.int64), offsets)
            for i, count, length in zip(long_enough, met.tolist(), lengths, strict=True):
                passed[i] = count >= share * length
    return out


def _tails(
    series: Sequence[Series], span: float
) -> tuple[list[int], NDArray[np.int64], list[int], FloatColumn]:
    """(the series that reach back `span`, where each one's tail starts in `joined`, its
    length, every such series' values of its last `span` joined)."""
    long_enough = [
        i for i, s in enumerate(series) if len(s.times) and s.times[-1] - s.times[0] >= span
    ]
    if not long_enough:
        return [], np.empty(0, dtype=np.int64), [], np.empty(0)
    starts = [
        int(series[i].times.searchsorted(series[i].times[-1] - span, side="left"))
        for i in long_enough
    ]
    tails = [series[i].values[start:] for i, start in zip(long_enough, starts, strict=True)]
    lengths = np.fromiter(map(len, tails), dtype=np.int64, count=len(tails))
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return long_enough, offsets, lengths.tolist(), np.concatenate(tails)


def over(values: FloatColumn, limit: float) -> NDArray[np.bool_]:
    """Which values are over `limit` (a `met_of` for sustained_where, with partial)."""
    return values > limit


def at_least(values: FloatColumn, limit: float) -> NDArray[np.bool_]:
    return values >= limit


def under(values: FloatColumn, limit: float) -> NDArray[np.bool_]:
    return values < limit


def _itself(met: NDArray[np.bool_]) -> NDArray[np.bool_]:
    return met


def mask_bits(values: FloatColumn, bits: int) -> NDArray[np.bool_]:
    """Which samples of a bitmask series (NVML throttle reasons) have any of `bits` set, as
    `int(value) & bits` says of each."""
    # (a NaN or an infinity fails the bound too: the max of |values| is then NaN or inf)
    if values.size and np.abs(values).max() < 2.0**62:
        return (np.trunc(values).astype(np.int64) & bits) != 0
    # what numpy cannot hold as int64 (or int() refuses, as it did before) goes one by one
    return np.array([bool(int(v) & bits) for v in values.tolist()], dtype=bool)
