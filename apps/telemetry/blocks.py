"""Many series' points from chunk rows as they stream in, a block of rows at a time.

The detectors' window reads every window metric of every node of a cluster: ~1,800 series a
pass for 256 ranks, a chunk or a few each. Filtering, ordering and thinning each row's points
with numpy was ~20 numpy calls a row, and those calls, not the query, were the window's
telemetry cost (80 ms of CPU a pass). Here the same calls run once per block of rows: the
block's points as one array, a series code per point, one stable sort by (series, time).
What is held stays bounded by the series and the span, as rows stream in."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

from apps.core.codec import floats_decode, ints_decode
from apps.telemetry.arrays import arrays_joined

Key = tuple[int, int, int]  # (node id, metric id, gpu)
Points = tuple[np.ndarray, np.ndarray]  # (ts in epoch seconds, values), in time order


class SeriesBlocks:
    """Collects (node id, metric id, gpu, e0, offsets_ms, vals, ts_pco, vals_pco) rows,
    ordered by series then t0 (the chunks' stored order), into each series' points in
    [start, end), in time order; equal times keep the order they were stored in. With
    `resolution` > 0, at most one point per series in each `resolution`-second slot of the
    epoch (`floor(ts / resolution)`, not counted from `start`: a series' slots stay put as
    its window slides, so a window kept between passes thins as a fresh read does): the
    newest (of equal times, the one stored last)."""

    def __init__(self, *, start: float, end: float, resolution: float = 0.0) -> None:
        self.start, self.end, self.resolution = start, end, resolution
        slots = max(1, math.ceil((end - start) / resolution)) if resolution > 0 else 0
        # a series holding more than this merges its parts: thinned, it stays near `slots`
        self.cap = 2 * slots if slots else None
        self.parts: dict[Key, list[Points]] = {}
        self.held: dict[Key, int] = {}

    def add(self, rows: Sequence[Sequence]) -> None:
        """One block of rows."""
        if not rows:
            return
        keys, code, ts, values = _block_points(rows)
        inside = (ts >= self.start) & (ts < self.end)
        code, ts, values = code[inside], ts[inside], values[inside]
        order = np.lexsort((ts, code))  # stable: equal times keep the stored order
        code, ts, values = code[order], ts[order], values[order]
        code, ts, values = self._thinned(code, ts, values)
        if not len(code):
            return
        # split as slices (views), not np.split's per-part arrays
        bounds = (np.flatnonzero(code[1:] != code[:-1]) + 1).tolist()
        firsts = code[[0, *bounds]].tolist()
        parts, held = self.parts, self.held
        for each, first, last in zip(firsts, [0, *bounds], [*bounds, len(code)], strict=True):
            key = keys[each]
            if key in parts:
                self._hold_more(key, (ts[first:last], values[first:last]))
            else:  # a series' first part (most series: their chunks in one block): nothing to merge
                parts[key], held[key] = [(ts[first:last], values[first:last])], last - first

    def series(self) -> dict[Key, list[tuple[float, float]]]:
        """Each series that has points in the range: its (ts, value) points."""
        return {
            key: list(zip(ts.tolist(), values.tolist(), strict=True))
            for key, (ts, values) in self.columns().items()
        }

    def columns(self) -> dict[Key, Points]:
        """Each series that has points in the range: its (ts, values) as float64 arrays."""
        return {
            key: parts[0] if len(parts) == 1 else self._merged(parts)
            for key, parts in self.parts.items()
        }

    def _hold_more(self, key: Key, part: Points) -> None:
        """A later part of a series already held."""
        parts = self.parts[key]
        parts.append(part)
        self.held[key] += len(part[0])
        if self.cap is not None and self.held[key] > self.cap and len(parts) > 1:
            merged = self._merged(parts)  # amortised: each series stays bounded
            self.parts[key], self.held[key] = [merged], len(merged[0])

    def _merged(self, parts: list[Points]) -> Points:
        """A series' parts (each in time order, later blocks' after) as one."""
        ts = np.concatenate([part[0] for part in parts])
        values = np.concatenate([part[1] for part in parts])
        order = np.argsort(ts, kind="stable")
        code = np.zeros(len(ts), dtype=np.int64)
        _, ts, values = self._thinned(code, ts[order], values[order])
        return ts, values

    def _thinned(
        self, code: np.ndarray, ts: np.ndarray, values: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Points ordered by (series, time) → the last of each series' slots."""
        if self.resolution <= 0 or len(ts) < 2:
            return code, ts, values
        slot = np.floor(ts / self.resolution)
        last = np.append((slot[1:] != slot[:-1]) | (code[1:] != code[:-1]), True)
        return code[last], ts[last], values[last]


def chunk_arrays(
    offsets: list[int] | np.ndarray | None,
    vals: list[float] | np.ndarray | None,
    ts_pco: bytes | None = None,
    vals_pco: bytes | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(ms offsets from t0 as int64, values as float64) of one stored chunk, encoded
    (sealed) or as arrays: the one place that knows both forms."""
    if ts_pco is not None and vals_pco is not None:
        return ints_decode(ts_pco), floats_decode(vals_pco)
    return (
        np.asarray(offsets if offsets is not None else [], dtype=np.int64),
        np.asarray(vals if vals is not None else [], dtype=np.float64),
    )


def _block_points(rows: Sequence[Sequence]) -> tuple[list[Key], np.ndarray, np.ndarray, np.ndarray]:
    """(the block's series keys, each point's index into them, ts, values) of a block of
    rows; ts is `e0 + offset / 1000`, the same float the SQL reads of arrays compute. A row's
    `e0` is its chunk's start."""
    keys: list[Key] = []
    codes: list[int] = []
    offsets: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for node_id, metric_id, gpu, _, *stored in rows:
        key = (node_id, metric_id, gpu)
        if not keys or keys[-1] != key:
            keys.append(key)
        codes.append(len(keys) - 1)
        offsets_ms, vals = chunk_arrays(*stored)
        offsets.append(offsets_ms)
        values.append(vals)
    lengths = [len(each) for each in offsets]
    code = np.repeat(np.array(codes, dtype=np.int64), lengths)
    bases = np.repeat(np.array([row[3] for row in rows], dtype=np.float64), lengths)
    ts = bases + (np.concatenate(offsets) / 1000.0)
    return keys, code, ts, np.concatenate(values)


class SpanPoints:
    """The points of a spans read (node rows of node id, series (metric id << 16 | gpu +
    32768), chunk starts (e0, epoch seconds), offsets, values, encoded ones, and for raw
    chunks of more points their counts and joined arrays: `_SPANS_SQL`)
    as flat columns in the order read: each point's node id, metric id, gpu, chunk start,
    ts and value. A kept window places them into its own columns with a few numpy calls a
    pass, not a call per series (65,536 series a pass at 16,384 ranks: SeriesBlocks'
    per-series parts were 0.1 s of its CPU)."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, rows: Sequence[Sequence]) -> None:
        if rows:
            joined = _joined_points(rows)
            stored = [next(joined) if row[7] is not None else _node_points(row) for row in rows]
            lengths = [len(offsets) for offsets, _ in stored]
            offsets = np.concatenate([offsets for offsets, _ in stored])
            values = np.concatenate([vals for _, vals in stored])
            nodes = np.repeat(np.array([row[0] for row in rows], dtype=np.int64), lengths)
            series = np.concatenate([_per_point(row, 1) for row in rows]).astype(np.int64)
            metrics, gpus = series >> 16, (series & 0xFFFF) - 32768
            starts = np.concatenate([_per_point(row, 2) for row in rows]).astype(np.float64)
            ts = starts + (offsets / 1000.0)
            self.parts.append((nodes, metrics, gpus, starts, ts, values))

    def columns(self) -> tuple[np.ndarray, ...]:
        """(node ids, metric ids, gpus, chunk starts, ts, values), a point each."""
        if not self.parts:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, empty, np.empty(0), np.empty(0), np.empty(0)
        return tuple(np.concatenate(each) for each in zip(*self.parts, strict=True))


def _joined_points(rows: Sequence[Sequence]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ms offsets, values) of each of `rows` that holds raw chunks of more points (each
    chunk's count, and their arrays joined), in order: decoded for all such rows at once (a
    call a row was 60 µs, 2,048 a pass at 16,384 ranks)."""
    joined = [row for row in rows if row[7] is not None]
    if not joined:
        return iter(())
    counts = np.concatenate([row[7] for row in joined])
    offsets = arrays_joined(b"".join(row[8] for row in joined), counts, "int4")
    values = arrays_joined(b"".join(row[9] for row in joined), counts, "float8")
    chunk_ends = np.cumsum([len(row[7]) for row in joined])
    splits = np.cumsum(counts)[chunk_ends - 1][:-1]  # where each row's points end
    return zip(np.split(offsets, splits), np.split(values, splits), strict=True)


def _node_points(row: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """(ms offsets from each point's chunk start, values) of a spans read's node row of
    one-point chunks (no offsets: each point is at its chunk's start) or of a sealed one."""
    offsets, vals, ts_pco = row[3], row[4], row[5]
    if offsets is None and ts_pco is None:
        return np.zeros(len(vals), dtype=np.int64), np.asarray(vals, dtype=np.float64)
    return chunk_arrays(offsets, vals, ts_pco, row[6])


def _per_point(row: Sequence, column: int) -> np.ndarray:
    """A spans read row's series or chunk starts, one a point: a row of many-point raw
    chunks sends them one a chunk."""
    counts = row[7]
    return row[column] if counts is None else np.repeat(row[column], counts)
