"""Every series of a cluster's kept telemetry window in one pair of flat buffers.

A series is a row: its points are times and values in [lo, n) of the buffers, in time order,
with room up to `end` for the points of later passes. A pass places what it read into every
row at once with numpy (appending in place past `n`: the common case of samples newer than
any held), finds each row's window by one bisection over all rows, and builds a `Series`
only for the rows whose window moved. A buffer per series, which this replaced, cost a few
numpy calls and Python objects per series and pass: 65,536 series at 16,384 ranks.

Nothing at or before a row's `n` is ever written again: new points go past it, a row whose
points change within what it holds gets the new ones past it or in a fresh region at the
buffers' top, and a full rebuild moves every row to new buffers. So the Series handed on as
slices of read-only views stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from detectors.types import Series

Key = tuple[int, int, int]  # (node id, metric id, gpu); gpu < 0: a host-wide series
Points = tuple[np.ndarray, np.ndarray]  # (ts, values)
# Room a row keeps past its points for those of later passes: a row holding L points gets
# L × _ROOM (at least _ROOM_MIN); the buffers keep an eighth more for rows that move.
_ROOM = 1.5
_ROOM_MIN = 16


def _room(lengths: np.ndarray) -> np.ndarray:
    return np.maximum(_ROOM_MIN, (lengths * _ROOM).astype(np.int64))


class SeriesColumns:
    """A cluster's kept series (module docstring), rows in key order: (node id, metric id,
    gpu), as a whole read returns them."""

    def __init__(self, parts: Mapping[Key, Points], metric_names: Mapping[int, str]) -> None:
        self.metric_names = dict(metric_names)
        self.metric_ids = np.array(sorted(metric_names), dtype=np.int64)
        if len(self.metric_ids) >= 1 << 15:
            raise ValueError("over 32,767 window metrics")
        self._build(dict(sorted(parts.items())), extra=None)

    # -- building -------------------------------------------------------------------------

    def _build(self, parts: dict[Key, Points], extra: np.ndarray | None) -> None:
        """Rows of `parts` (sorted by key), each with room for `extra` more points."""
        self.keys = list(parts)
        nodes = [key[0] for key in self.keys]
        self.row_node = np.array(nodes, dtype=np.int64)
        self.packed = self._pack(
            self.row_node,
            np.array([key[1] for key in self.keys], dtype=np.int64),
            np.array([key[2] for key in self.keys], dtype=np.int64),
        )
        self.gpus = [None if key[2] < 0 else key[2] for key in self.keys]
        self.metrics = [self.metric_names[key[1]] for key in self.keys]
        lengths = np.fromiter((len(ts) for ts, _ in parts.values()), np.int64, len(parts))
        caps = _room(lengths + (0 if extra is None else extra))
        starts = (np.cumsum(caps) - caps).astype(np.int64)
        size = int(caps.sum())
        self.top = size
        spare = size // 8 + _ROOM_MIN  # for rows that move (late samples)
        self.ts, self.values = np.empty(size + spare), np.empty(size + spare)
        self.ts_read, self.values_read = _read_only(self.ts), _read_only(self.values)
        self.lo, self.n, self.end = starts.copy(), starts + lengths, starts + caps
        self.last = np.full(len(parts), -np.inf)
        for row, ((ts, values), at, length) in enumerate(
            zip(parts.values(), starts.tolist(), lengths.tolist(), strict=True)
        ):
            if length:
                self.ts[at : at + length], self.values[at : at + length] = ts, values
                self.last[row] = ts[-1]
        # what the last pass handed on: a row's Series and its [lo, j) then (-1: none)
        self.handed: list[Series | None] = [None] * len(parts)
        self.handed_lo = np.full(len(parts), -1, dtype=np.int64)
        self.handed_j = np.full(len(parts), -1, dtype=np.int64)

    def _rebuilt(self, *, keep: np.ndarray | None = None, extra: np.ndarray | None = None,
                 added: Iterable[Key] = ()) -> None:  # fmt: skip
        """Every row (or those `keep` says) moved to new buffers with room for `extra` more
        points, plus empty rows for the keys `added`."""
        rows = range(len(self.keys)) if keep is None else np.flatnonzero(keep).tolist()
        parts = {self.keys[row]: self.live(row) for row in rows}
        more = {} if extra is None else dict(zip(self.keys, extra.tolist(), strict=True))
        empty = (np.empty(0), np.empty(0))
        parts |= {key: empty for key in added}
        parts = dict(sorted(parts.items()))
        self._build(parts, np.array([more.get(key, 0) for key in parts], dtype=np.int64))

    def _pack(self, nodes: np.ndarray, metrics: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        """Keys as int64 in key order: node id (int4) · metric's place · gpu (int2)."""
        places = np.searchsorted(self.metric_ids, metrics)
        return (nodes << 32) | (places << 16) | (gpus + 32768)

    # -- reading --------------------------------------------------------------------------

    def live(self, row: int) -> Points:
        lo, n = int(self.lo[row]), int(self.n[row])
        return self.ts_read[lo:n], self.values_read[lo:n]

    @property
    def size(self) -> int:
        """Points held."""
        return int((self.n - self.lo).sum())

    # -- a pass ---------------------------------------------------------------------------

    def replace_spans(
        self,
        spans: Mapping[int, tuple[float, float]],
        points: tuple[np.ndarray, ...],
        resolution: float,
    ) -> None:
        """Each node's rows: their points in its span [a, b) become the `points` (node id,
        metric id, gpu, chunk start, ts, value each; a chunk's points together, in their
        stored order) that fall in it, ordered as a whole read orders them (by time, then
        chunk start, then as given) and thinned to the newest of each `resolution`-second
        slot (spans cover whole slots)."""
        span_nodes = np.array(sorted(spans), dtype=np.int64)
        span_a = np.array([spans[n][0] for n in span_nodes.tolist()])
        span_b = np.array([spans[n][1] for n in span_nodes.tolist()])
        nodes, metrics, gpus, starts, ts, values = points
        place = np.minimum(np.searchsorted(span_nodes, nodes), len(span_nodes) - 1)
        inside = (span_nodes[place] == nodes) & (ts >= span_a[place]) & (ts < span_b[place])
        inside &= np.isin(metrics, self.metric_ids)
        packed = self._pack(nodes[inside], metrics[inside], gpus[inside])
        starts, ts, values = starts[inside], ts[inside], values[inside]
        rows = self._rows_of(packed)
        order = np.lexsort((starts, ts, rows))  # stable: what ties stays as given
        rows, ts, values = rows[order], ts[order], values[order]
        if resolution > 0 and len(ts) > 1:
            slot = np.floor(ts / resolution)
            newest = np.append((slot[1:] != slot[:-1]) | (rows[1:] != rows[:-1]), True)
            rows, ts, values = rows[newest], ts[newest], values[newest]
        counts = np.bincount(rows, minlength=len(self.keys))
        touched = np.flatnonzero(np.isin(self.row_node, span_nodes))
        where = np.searchsorted(span_nodes, self.row_node[touched])
        appends = self.last[touched] < span_a[where]  # every held point before the span
        self._append(touched[appends & (counts[touched] > 0)], rows, ts, values, counts)
        rewrite = ~appends
        self._rewrite(touched[rewrite], span_a[where[rewrite]], span_b[where[rewrite]],
                      rows, ts, values, counts)  # fmt: skip

    def _rows_of(self, packed: np.ndarray) -> np.ndarray:
        """Each packed key's row, adding empty rows for keys not held."""
        rows = np.searchsorted(self.packed, packed)
        known = rows < len(self.packed)
        known[known] = self.packed[rows[known]] == packed[known]
        if not known.all():
            new = np.unique(packed[~known])
            nodes, places, gpus = new >> 32, (new >> 16) & 0xFFFF, (new & 0xFFFF) - 32768
            metric_ids = self.metric_ids[places]
            added = zip(nodes.tolist(), metric_ids.tolist(), gpus.tolist(), strict=True)
            self._rebuilt(added=list(added))
            rows = np.searchsorted(self.packed, packed)
        return rows

    def _append(self, appended: np.ndarray, rows: np.ndarray, ts: np.ndarray,
                values: np.ndarray, counts: np.ndarray) -> None:  # fmt: skip
        """The points of the rows `appended` (all after what those rows hold) written past
        their `n`, in place: one scatter for every row."""
        if not appended.size:
            return
        more = counts[appended]
        full = self.n[appended] + more > self.end[appended]
        if full.any():
            extra = np.zeros(len(self.keys), dtype=np.int64)
            extra[appended[full]] = more[full]
            self._rebuilt(extra=extra)
        chosen = np.zeros(len(self.keys), dtype=bool)
        chosen[appended] = True
        mine = chosen[rows]
        at_rows, at_ts, at_values = rows[mine], ts[mine], values[mine]
        firsts = np.cumsum(more) - more
        nth = np.arange(len(at_rows)) - np.repeat(firsts, more)
        at = self.n[at_rows] + nth
        self.ts[at], self.values[at] = at_ts, at_values
        self.n[appended] += more
        self.last[appended] = at_ts[firsts + more - 1]

    def _rewrite(self, rewritten: np.ndarray, span_a: np.ndarray, span_b: np.ndarray,
                 rows: np.ndarray, ts: np.ndarray, values: np.ndarray,
                 counts: np.ndarray) -> None:  # fmt: skip
        """Rows holding points at or past their span's start: each gets its points before
        the span, the new ones and its points after, past its `n` or at the top (a row at a
        time: late samples, or a window thinned coarser than the samples come)."""
        firsts = np.concatenate(([0], np.cumsum(counts)))
        for row, a, b in zip(rewritten.tolist(), span_a.tolist(), span_b.tolist(), strict=True):
            held_ts, held_values = self.live(row)
            i, j = held_ts.searchsorted((a, b)).tolist()
            f0, f1 = int(firsts[row]), int(firsts[row + 1])
            if i == j and f0 == f1:  # nothing held in the span, nothing new: as it was
                continue
            self._place(
                row,
                np.concatenate((held_ts[:i], ts[f0:f1], held_ts[j:])),
                np.concatenate((held_values[:i], values[f0:f1], held_values[j:])),
            )

    def _place(self, row: int, ts: np.ndarray, values: np.ndarray) -> None:
        """A row's points become these: past its `n` when they fit, else at the top, else
        in new buffers."""
        count = len(ts)
        at = int(self.n[row])
        if at + count > self.end[row]:
            room = int(_room(np.array([count]))[0])
            if self.top + room > len(self.ts):
                extra = np.zeros(len(self.keys), dtype=np.int64)
                extra[row] = count
                self._rebuilt(extra=extra)
                at = int(self.n[row])
            else:
                at, self.top = self.top, self.top + room
                self.end[row] = at + room
        self.ts[at : at + count], self.values[at : at + count] = ts, values
        self.lo[row], self.n[row] = at, at + count
        self.last[row] = ts[-1] if count else -np.inf

    def window(self, *, start: float, end: float, names: Mapping[int, str]) -> list[Series]:
        """Each row's points in [start, end) as a Series, in key order, for the nodes of
        `names`: last pass's Series where the same points. Points before `start` are
        dropped for good, and rows left with none."""
        first = _left(self.ts, self.lo, self.n, start)
        empty = first == self.n
        if empty.any():
            self.lo = first
            self._rebuilt(keep=~empty)
            first = self.lo
        self.lo = first
        stop = _left(self.ts, self.lo, self.n, end)
        shown = (stop > first) & np.isin(self.row_node, np.fromiter(names, np.int64, len(names)))
        same = shown & (self.handed_lo == first) & (self.handed_j == stop)
        handed, keys, ts, values = self.handed, self.keys, self.ts_read, self.values_read
        remade = np.flatnonzero(shown & ~same)
        for row, i, j in zip(remade.tolist(), first[remade].tolist(), stop[remade].tolist(),
                             strict=True):  # fmt: skip
            handed[row] = Series.of_columns(
                names[keys[row][0]], self.metrics[row], self.gpus[row], ts[i:j], values[i:j]
            )
        self.handed_lo = np.where(shown, first, -1)
        self.handed_j = np.where(shown, stop, -1)
        return [handed[row] for row in np.flatnonzero(shown).tolist()]  # type: ignore[misc]


def _left(times: np.ndarray, lo: np.ndarray, hi: np.ndarray, x: float) -> np.ndarray:
    """Each row's first position in [lo, hi) whose time is ≥ x (hi when none): a left
    bisection of every row at once, but for rows whose points are all below x (as at the
    window's end, nearly every row) or none is (nothing to drop at its start), which one
    look at their last or first point settles."""
    lo, hi = lo.copy(), hi.copy()
    rows = np.flatnonzero(lo < hi)
    below = times[hi[rows] - 1] < x
    lo[rows[below]] = hi[rows[below]]
    rows = rows[~below]
    none_below = times[lo[rows]] >= x
    hi[rows[none_below]] = lo[rows[none_below]]
    active = rows[~none_below]
    while active.size:
        mid = (lo[active] + hi[active]) // 2
        below = times[mid] < x
        lo[active[below]] = mid[below] + 1
        hi[active[~below]] = mid[~below]
        active = active[lo[active] < hi[active]]
    return lo


def _read_only(column: np.ndarray) -> np.ndarray:
    view = column.view()
    view.flags.writeable = False
    return view
