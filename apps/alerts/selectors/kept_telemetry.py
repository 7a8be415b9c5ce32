"""The detectors' telemetry window kept by a periodic worker between its passes over a cluster.

Reading a cluster's window metrics whole each pass was most of a live pass: 1.0 s of 1.06 s
at 1,024 ranks (128 nodes × 8 GPUs, 1 Hz samples), almost all of it decoding the same points
into the same Python tuples again. Kept, a pass reads only each node's span that got samples
since this worker's last pass over the cluster (apps.telemetry.changes says which, exactly),
replaces the kept points of that span with what it read, drops the points that fell out of
the window, and hands the detectors each series' points as read-only slices of its kept
columns (every series' times and values in one pair of numpy buffers that later passes
append to in place, past what was handed: `SeriesColumns`; a pass places and windows every
series with a few numpy calls, and builds a `Series` only for those whose window moved): an
unchanged series is the same `Series` as last pass.

The window a pass sees is the one a whole read gives (`series_points` over [now − window,
`live_telemetry_end(now)`)): a span read again holds every stored point of it, ordered as
a whole read orders them (by time, then chunk start, then as stored: kept_columns), and
thinning per slot is the same because slots count from the epoch and spans are widened to
whole slots (apps.telemetry.blocks). Points up to LOAD_AHEAD_S past now are kept
(an agent may stamp its samples ahead of the server's clock; ingest allows 5 minutes) and
handed on once the window's end passes them. A window seen for the first time, whose kept
copy is older than KEPT_MAX_AGE_S, whose log was pruned past it, or whose metrics changed is
read whole.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from django.conf import settings

from apps.alerts.selectors.kept_columns import SeriesColumns
from apps.telemetry.changes import sample_changes_since, sample_changes_snapshot
from apps.telemetry.selectors import series_columns, span_points
from detectors.types import Series

# Past this a kept window is read whole: well inside the change log's retention.
KEPT_MAX_AGE_S = 60.0
# Samples stamped up to this far past now are kept for later passes (ingest's limit is 300).
LOAD_AHEAD_S = 600.0
# A changed span of a node is read from this much before its first sample when the window
# does not thin (resolution 0): the change log's floats round the stored microseconds.
_SPAN_MARGIN_S = 1e-3


@dataclass
class KeptSeries:
    """One cluster's telemetry window as this worker's last pass left it."""

    watermark: int | None = None  # apps.telemetry.changes: the last pass's snapshot xmin
    used_at: float = 0.0  # time.monotonic() of the last pass
    metrics: dict[int, str] = field(default_factory=dict)
    columns: SeriesColumns | None = None

    @property
    def size(self) -> int:
        """Points held."""
        return 0 if self.columns is None else self.columns.size


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
    resolution = settings.ALERT_TELEMETRY_RESOLUTION_S
    columns = kept.columns
    if (
        columns is not None
        and snapshot.covers(kept.watermark)
        and time.monotonic() - kept.used_at <= KEPT_MAX_AGE_S
        and kept.metrics == metrics
    ):
        changes = sample_changes_since(node_ids=list(names), xid=kept.watermark or 0)
        spans = _spans_widened(changes, start=start)
        if spans:
            points = span_points(spans=spans, metric_ids=list(metrics)).columns()
            columns.replace_spans(spans, points, resolution)
    else:
        kept.metrics = dict(metrics)
        read = series_columns(
            node_ids=list(names), metric_ids=list(metrics), start=start,
            end=now + LOAD_AHEAD_S, resolution=resolution,
        ).columns()  # fmt: skip
        columns = kept.columns = SeriesColumns(read, metrics)
    kept.watermark, kept.used_at = snapshot.xmin, time.monotonic()
    return columns.window(start=start, end=live_telemetry_end(now), names=names)


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
