"""The detectors' telemetry window kept by a periodic worker between its passes over a cluster.

Reading a cluster's window metrics whole each pass was most of a live pass: 1.0 s of 1.06 s
at 1,024 ranks (128 nodes × 8 GPUs, 1 Hz samples), almost all of it decoding the same points
into the same Python tuples again. Kept, a pass reads only each node's span that got samples
since this worker's last pass over the cluster (apps.telemetry.changes says which, exactly),
replaces the kept points of that span with what it read, drops the points that fell out of
the window, and hands the detectors each series' points as a slice of the kept tuple: an
unchanged series is the same `Series` as last pass.

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
from bisect import bisect_left
from dataclasses import dataclass, field
from operator import itemgetter

from django.conf import settings

from apps.telemetry.changes import sample_changes_since, sample_changes_snapshot
from apps.telemetry.selectors import series_points, series_points_in_spans
from detectors.types import Series

# Past this a kept window is read whole: well inside the change log's retention.
KEPT_MAX_AGE_S = 60.0
# Samples stamped up to this far past now are kept for later passes (ingest's limit is 300).
LOAD_AHEAD_S = 600.0
# A changed span of a node is read from this much before its first sample when the window
# does not thin (resolution 0): the change log's floats round the stored microseconds.
_SPAN_MARGIN_S = 1e-3

Key = tuple[int, int, int]  # (node id, metric id, gpu)
Points = tuple[tuple[float, float], ...]
_TS = itemgetter(0)


@dataclass
class KeptSeries:
    """One cluster's telemetry window as this worker's last pass left it."""

    watermark: int | None = None  # apps.telemetry.changes: the last pass's snapshot xmin
    used_at: float = 0.0  # time.monotonic() of the last pass
    metrics: dict[int, str] = field(default_factory=dict)
    points: dict[Key, Points] = field(default_factory=dict)  # sorted by key
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
        read = series_points(
            node_ids=list(names), metric_ids=list(metrics), start=start,
            end=now + LOAD_AHEAD_S, resolution=settings.ALERT_TELEMETRY_RESOLUTION_S,
        )  # fmt: skip
        kept.points = {key: tuple(points) for key, points in sorted(read.items())}
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
    there now. Returns the series it replaced points of."""
    if not spans:
        return set()
    read = series_points_in_spans(
        spans=spans, metric_ids=metric_ids, resolution=settings.ALERT_TELEMETRY_RESOLUTION_S
    )
    touched = {key for key in kept.points if key[0] in spans} | set(read)
    added = False
    for key in touched:
        a, b = spans[key[0]]
        fresh = tuple(point for point in read.get(key, ()) if a <= point[0] < b)
        held = kept.points.get(key, ())
        i, j = bisect_left(held, a, key=_TS), bisect_left(held, b, key=_TS)
        added |= key not in kept.points
        kept.points[key] = held[:i] + fresh + held[j:]
    if added:
        kept.points = dict(sorted(kept.points.items()))
    return touched


def _handed(
    kept: KeptSeries, changed: set[Key], *, names: dict[int, str], start: float, end: float
) -> list[Series]:
    """Each kept series' points in [start, end) as a Series, in (node id, metric id, gpu)
    order as a whole read returns them: last pass's Series when the same points (not
    `changed`, and the same slice of its kept tuple). Points before `start` are dropped
    from the kept window."""
    handed: dict[Key, Series] = {}
    size = 0
    for key, points in kept.points.items():
        i = bisect_left(points, start, key=_TS)
        if i:
            points = kept.points[key] = points[i:]
        j = bisect_left(points, end, key=_TS)
        size += len(points)
        node_id, metric_id, gpu = key
        if not j or node_id not in names:
            continue
        shown = points[:j] if j < len(points) else points
        last = kept.handed.get(key)
        if last is None or key in changed or not _same_points(last.points, shown):
            last = Series(node=names[node_id], metric=kept.metrics[metric_id],
                          gpu=None if gpu < 0 else gpu, points=shown)  # fmt: skip
        handed[key] = last
    kept.points = {key: points for key, points in kept.points.items() if points}
    kept.handed, kept.size = handed, size
    return list(handed.values())


def _same_points(last: Points, shown: Points) -> bool:
    """Whether a slice of a series' kept points that no span replaced is what was handed
    before: then it only lost points at its start or gained some at its end, and the same
    first and last point objects and length say neither happened."""
    return len(last) == len(shown) and (
        not shown or (last[0] is shown[0] and last[-1] is shown[-1])
    )
