"""The detectors' telemetry window kept by a periodic worker between its passes over a cluster.

Reading a cluster's window metrics whole each pass was most of a live pass: 1.0 s of 1.06 s
at 1,024 ranks (128 nodes × 8 GPUs, 1 Hz samples), almost all of it decoding the same points
into the same Python tuples again. Kept, a pass reads only each node's span that got samples
since this worker's last pass over the cluster (apps.telemetry.changes says which, exactly),
replaces the kept points of that span with what it read, drops the points that fell out of
the window, and hands the detectors each series' points as read-only slices of its kept
columns (times and values in numpy buffers that later passes append to in place, past what
was handed: `Buffers`; a pass costs a few numpy calls a series, not a Python tuple a point):
an unchanged series is the same `Series` as last pass.

The window a pass sees is the one a whole read gives (`series_points` over [now − window,
`live_telemetry_end(now)`)): a span read again holds every stored point of it, in the stored
order, and thinning per slot is the same because slots count from the epoch and spans are
widened to whole slots (apps.telemetry.blocks). Points up to LOAD_AHEAD_S past now are kept
(an agent may stamp its samples ahead of the server's clock; ingest allows 5 minutes) and
handed on once the window's end passes them. A window seen for the first time, whose kept
copy is older than KEPT_MAX_AGE_S, whose log was pruned past it, or whose metrics changed is
read whole.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings

from apps.telemetry.changes import sample_changes_since, sample_changes_snapshot
from apps.telemetry.selectors import series_columns, series_columns_in_spans
from detectors.types import Series

# Past this a kept window is read whole: well inside the change log's retention.
KEPT_MAX_AGE_S = 60.0
# Samples stamped up to this far past now are kept for later passes (ingest's limit is 300).
LOAD_AHEAD_S = 600.0
# A changed span of a node is read from this much before its first sample when the window
# does not thin (resolution 0): the change log's floats round the stored microseconds.
_SPAN_MARGIN_S = 1e-3

Key = tuple[int, int, int]  # (node id, metric id, gpu)
_NONE = np.empty(0, dtype=np.float64)
_NONE.flags.writeable = False
# Room a series' buffers keep past its points for those of later passes: a pass appends in
# place until they are full, then the points move to new buffers this much larger.
_ROOM = 1.5
_ROOM_MIN = 16


class Buffers:
    """One series' kept points: its times and values in [lo, n) of two buffers. A pass that
    adds points after all of them writes them in place past `n`; anything else (a span that
    replaces points, full buffers) moves the points to new buffers. Nothing at or before
    `n` is ever written again, so the slices handed on in a Series stay as they were: they
    are slices of read-only views of the buffers (`ts_read`, `values_read`), which a Series
    takes as they are (`Series.of_columns`)."""

    __slots__ = ("ts", "values", "ts_read", "values_read", "lo", "n", "last")

    def __init__(self, ts: np.ndarray, values: np.ndarray) -> None:
        size = max(_ROOM_MIN, int(len(ts) * _ROOM))
        self.ts, self.values = np.empty(size), np.empty(size)
        self.ts[: len(ts)], self.values[: len(ts)] = ts, values
        self.ts_read, self.values_read = _read_only(self.ts), _read_only(self.values)
        self.lo, self.n = 0, len(ts)
        self.last = ts[-1].item() if len(ts) else -math.inf  # the newest time, as a float

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        return self.ts_read[self.lo : self.n], self.values_read[self.lo : self.n]

    def replace(self, a: float, b: float, ts: np.ndarray, values: np.ndarray) -> Buffers:
        """These points with those in [a, b) replaced by `ts`/`values` (all in [a, b)):
        itself, appended to in place, or new buffers."""
        if self.last < a and self.n + len(ts) <= len(self.ts):
            end = self.n + len(ts)
            self.ts[self.n : end], self.values[self.n : end] = ts, values
            self.n = end
            if len(ts):
                self.last = ts[-1].item()
            return self
        held_ts, held_values = self.live()
        i, j = held_ts.searchsorted((a, b)).tolist()
        return Buffers(
            np.concatenate((held_ts[:i], ts, held_ts[j:])),
            np.concatenate((held_values[:i], values, held_values[j:])),
        )


def _read_only(column: np.ndarray) -> np.ndarray:
    view = column.view()
    view.flags.writeable = False
    return view


@dataclass
class KeptSeries:
    """One cluster's telemetry window as this worker's last pass left it."""

    watermark: int | None = None  # apps.telemetry.changes: the last pass's snapshot xmin
    used_at: float = 0.0  # time.monotonic() of the last pass
    metrics: dict[int, str] = field(default_factory=dict)
    columns: dict[Key, Buffers] = field(default_factory=dict)  # sorted by key
    handed: dict[Key, Series] = field(default_factory=dict)  # what the last pass handed on
    size: int = 0  # points held


def live_telemetry_end(now: float) -> float:
    """The (exclusive) end of a live pass's telemetry: a second past now, at a slot's edge so
    that the last slot is whole (a point past the end would otherwise hide an older one of
    its slot from a window that thinned it with what came later)."""
    resolution = settings.ALERT_TELEMETRY_RESOLUTION_S
    end = now + 1.0
    return math.ceil(end / resolution) * resolution if resolution > 0 else end


def telemetry_kept(
    *, names: dict[int, str], metrics: dict[int, str], now: float, kept: KeptSeries
) -> list[Series]:
    """The window metrics' series of the nodes `names`, updating `kept` (module docstring)."""
    snapshot = sample_changes_snapshot()  # before anything it vouches for is read
    start = now - settings.ALERT_TELEMETRY_WINDOW_S
    changed: set[Key] = set()
    fresh = (
        snapshot.covers(kept.watermark)
        and time.monotonic() - kept.used_at <= KEPT_MAX_AGE_S
        and kept.metrics == metrics
    )
    if fresh:
        changes = sample_changes_since(node_ids=list(names), xid=kept.watermark or 0)
        changed = _spans_replace(kept, _spans_widened(changes, start=start), list(metrics))
    else:
        kept.handed, kept.metrics = {}, dict(metrics)
        read = series_columns(
            node_ids=list(names), metric_ids=list(metrics), start=start,
            end=now + LOAD_AHEAD_S, resolution=settings.ALERT_TELEMETRY_RESOLUTION_S,
        ).columns()  # fmt: skip
        kept.columns = {key: Buffers(*columns) for key, columns in sorted(read.items())}
    kept.watermark, kept.used_at = snapshot.xmin, time.monotonic()
    return _handed(kept, changed, names=names, start=start, end=live_telemetry_end(now))


def _spans_widened(
    changes: dict[int, tuple[float, float]], *, start: float
) -> dict[int, tuple[float, float]]:
    """Each node's changed span [first, last] as [a, b) covering whole slots, from `start`
    on (older points are out of the window for good)."""
    resolution = settings.ALERT_TELEMETRY_RESOLUTION_S
    if resolution <= 0:
        spans = {
            n: (first - _SPAN_MARGIN_S, last + _SPAN_MARGIN_S)
            for n, (first, last) in changes.items()
        }
        low = start
    else:
        spans = {
            n: (
                math.floor(first / resolution) * resolution,
                (math.floor(last / resolution) + 1) * resolution,
            )
            for n, (first, last) in changes.items()
        }
        low = math.floor(start / resolution) * resolution
    return {n: (max(a, low), b) for n, (a, b) in spans.items() if b > start}


def _spans_replace(
    kept: KeptSeries, spans: dict[int, tuple[float, float]], metric_ids: list[int]
) -> set[Key]:
    """Each changed node's series: their points in the node's span become what is stored
    there now. Returns the series it replaced points of. A series costs a few numpy calls
    on its columns, whatever it holds (the new points are copied in, the rest by memcpy)."""
    if not spans:
        return set()
    read = series_columns_in_spans(
        spans=spans, metric_ids=metric_ids, resolution=settings.ALERT_TELEMETRY_RESOLUTION_S
    ).columns()
    columns = kept.columns
    touched = {key for key in columns if key[0] in spans} | set(read)
    added = False
    for key in touched:
        a, b = spans[key[0]]
        fresh_ts, fresh_values = read.get(key, (_NONE, _NONE))
        count = len(fresh_ts)
        # the read's points in [a, b): other nodes' spans may bring more
        if count and (fresh_ts[0] < a or fresh_ts[count - 1] >= b):
            lo, hi = fresh_ts.searchsorted((a, b)).tolist()
            fresh_ts, fresh_values = fresh_ts[lo:hi], fresh_values[lo:hi]
            count = hi - lo
        held = columns.get(key)
        if held is None:
            if count:
                added = True
                columns[key] = Buffers(fresh_ts, fresh_values)
        elif count or held.last >= a:  # nothing to append after its points: as it was
            columns[key] = held.replace(a, b, fresh_ts, fresh_values)
    if added:
        kept.columns = dict(sorted(kept.columns.items()))
    return touched


def _handed(
    kept: KeptSeries, changed: set[Key], *, names: dict[int, str], start: float, end: float
) -> list[Series]:
    """Each kept series' points in [start, end) as a Series, in (node id, metric id, gpu)
    order as a whole read returns them: last pass's Series when the same points (not
    `changed`, and the same slice of its kept columns). Points before `start` are dropped
    from the kept window. An unchanged series' points only lose some at their start or gain
    some at their end, and the same length and first time say neither happened (the start
    is found by a left search, so a later start cannot land on a point of the same time)."""
    handed: dict[Key, Series] = {}
    size = 0
    edges = np.array((start, end), dtype=np.float64)
    dropped = []
    last_handed, metric_names = kept.handed, kept.metrics
    # Python floats and slices only past the one search a series: this loop runs for every
    # series of the cluster each pass (65,536 at 16,384 ranks)
    for key, held in kept.columns.items():
        lo, n = held.lo, held.n
        ts_read = held.ts_read
        i, j = ts_read[lo:n].searchsorted(edges).tolist()
        if i == n - lo:  # nothing left in the window (or nothing at all)
            dropped.append(key)
            continue
        lo += i
        held.lo = lo
        size += n - lo
        node_id, metric_id, gpu = key
        if j == i or node_id not in names:
            continue
        shown = j - i
        last = last_handed.get(key)
        if (
            last is None
            or key in changed
            or len(last.times) != shown
            or last.times[0] != ts_read[lo]
        ):
            last = Series.of_columns(
                names[node_id], metric_names[metric_id], None if gpu < 0 else gpu,
                ts_read[lo : lo + shown], held.values_read[lo : lo + shown],
            )  # fmt: skip
        handed[key] = last
    for key in dropped:
        del kept.columns[key]
    kept.handed, kept.size = handed, size
    return list(handed.values())
