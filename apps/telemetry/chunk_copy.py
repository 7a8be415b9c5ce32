"""Unsealed chunk rows as one binary COPY stream, built with numpy (apps/core/copy.py).

psycopg dumps an `int4[]` or `float8[]` in Python, element by element: for 10-point chunks
that was most of a drain's CPU (≈ 0.3 µs a point). Here the fixed fields of every row are one
structured array, the points of every row two more, and the stream is their bytes laid side
by side in the order of the binary COPY format: per row its field count, then per field its
byte length and value (an array: ndim, has-nulls, element type oid, length, lower bound,
then per element its length and value).

Every value is computed as the per-row Python did, so the rows stored are bit for bit the
same (tests/telemetry/test_chunk_copy.py compares them against psycopg's own dump).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from apps.core.copy import SIGNATURE, TRAILER, pg_microseconds, send_form
from apps.telemetry.arrays import ARRAY_HEAD_BYTES, FLOAT8_OID, INT4_OID
from apps.telemetry.columns import SampleColumns

INT4_MAX = 2**31 - 1

# an array's header after its byte length: ndim, has-nulls, element type oid, length, lower
# bound; the chunk row's offsets array begins in its head, its values array in its own
_ARRAY_HEAD = ("len", "ndim", "nulls", "oid", "dim", "lower")
_VALS_HEAD = np.dtype([(name, ">i4") for name in _ARRAY_HEAD])


class SeriesRanges(NamedTuple):
    """Per series written: its key and the timestamptz (pg_microseconds) of its first and
    last point, as arrays in the order of the series."""

    node_ids: np.ndarray
    metric_ids: np.ndarray
    gpus: np.ndarray
    t0s: np.ndarray
    t1s: np.ndarray

    @classmethod
    def empty(cls) -> SeriesRanges:
        return cls(*(np.empty(0, kind) for kind in ("i4", "i4", "i2", "i8", "i8")))


class ChunkRows(NamedTuple):
    stream: bytes  # the whole COPY … FROM STDIN (FORMAT BINARY) input
    count: int  # points
    ranges: SeriesRanges


def chunk_rows_binary(*, series: SampleColumns, metric_ids: dict[str, int]) -> ChunkRows:
    """One row per series for `telemetry_chunk`'s CHUNK_COLUMNS: points as offsets in ms
    from the first (rounded half to even, as `round`) and floats. Rows come grouped by
    their point count (one numpy layout per count), `ranges` in the order of the series."""
    keys, times, vals = series.keys, series.times, series.values
    starts, ends = series.bounds[:-1], series.bounds[1:]
    lengths = ends - starts
    offsets = np.rint((times - np.repeat(times[starts], lengths)) * 1000)
    if offsets.size and np.abs(offsets).max() > INT4_MAX:
        raise ValueError("a series spans more than 24 days of samples in one drain")

    ranges = SeriesRanges(
        np.fromiter((key[0] for key in keys), np.int32, len(keys)),
        np.fromiter((metric_ids[key[1]] for key in keys), np.int32, len(keys)),
        np.fromiter((key[2] for key in keys), np.int16, len(keys)),
        pg_microseconds(times[starts]),
        pg_microseconds(times[ends - 1]),
    )
    vmin, vmax, vsum = row_stats(vals, starts=starts, lengths=lengths)
    head = send_form(
        [
            ("int4", ranges.node_ids),
            ("int4", ranges.metric_ids),
            ("int2", ranges.gpus),
            ("timestamptz", ranges.t0s),
            ("timestamptz", ranges.t1s),
            ("int4", lengths),
            ("float8", vmin),
            ("float8", vmax),
            ("float8", vsum),
        ],
        field_count=11,
        tail=[f"offsets_{name}" for name in _ARRAY_HEAD],
    )
    _array_head(head, prefix="offsets_", oid=INT4_OID, lengths=lengths, element_bytes=8)
    vals_head = np.zeros(len(keys), _VALS_HEAD)
    _array_head(vals_head, prefix="", oid=FLOAT8_OID, lengths=lengths, element_bytes=12)
    rows = _RowParts(head, send_form([("int4", offsets)]), vals_head, send_form([("float8", vals)]))
    return ChunkRows(_stream(rows, starts=starts, lengths=lengths), len(vals), ranges)


# Rows longer than this get their min, max and sum from Python one by one: the vectorised
# pass takes a numpy step per point position, for every row still that long.
_VECTOR_ROW_MAX = 32


def row_stats(
    values: np.ndarray, *, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's (values[start:start + length]) minimum, maximum and sum, as a loop over
    its values gives them: the first of equal extremes (0.0 before -0.0, as `min`), and the
    sum added left to right from 0 (numpy's pairwise sum can differ in the last bit)."""
    vmin, vmax = np.empty(len(starts)), np.empty(len(starts))
    vsum = np.zeros(len(starts))
    short = np.flatnonzero(lengths <= _VECTOR_ROW_MAX)
    order = short[np.argsort(-lengths[short], kind="stable")]  # rows still going: a prefix
    first, size = starts[order], lengths[order]
    low, high, total = values[first], values[first], vsum[order] + values[first]
    for position in range(1, int(size[0]) if len(size) else 0):
        going = int(np.searchsorted(-size, -position))  # rows longer than `position`
        column = values[first[:going] + position]
        total[:going] += column
        low[:going] = np.where(column < low[:going], column, low[:going])
        high[:going] = np.where(column > high[:going], column, high[:going])
    vmin[order], vmax[order], vsum[order] = low, high, total
    for row in np.flatnonzero(lengths > _VECTOR_ROW_MAX).tolist():
        points = values[starts[row] : starts[row] + lengths[row]].tolist()
        vmin[row], vmax[row] = min(points), max(points)
        vsum[row] = _left_to_right_sum(points)
    return vmin, vmax, vsum


def _left_to_right_sum(points: list[float]) -> float:
    total = 0.0
    for point in points:
        total += point
    return total


def _array_head(
    head: np.ndarray, *, prefix: str, oid: int, lengths: np.ndarray, element_bytes: int
) -> None:
    head[f"{prefix}len"] = ARRAY_HEAD_BYTES + lengths * element_bytes
    head[f"{prefix}ndim"], head[f"{prefix}oid"], head[f"{prefix}lower"] = 1, oid, 1
    head[f"{prefix}dim"] = lengths


class _RowParts(NamedTuple):
    """Per row its head (fixed fields, offsets array header) and values array header; per
    point its offset and value elements (length and value each)."""

    head: np.ndarray
    offset_points: np.ndarray
    vals_head: np.ndarray
    value_points: np.ndarray


def _stream(parts: _RowParts, *, starts: np.ndarray, lengths: np.ndarray) -> bytes:
    """signature, rows, trailer: the rows of each point count laid out by one structured
    array (head, offsets, values head, values), so no Python step is taken per row."""
    chunks: list[bytes] = [SIGNATURE]
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        points = starts[rows, None] + np.arange(length)
        layout = np.dtype(
            [
                ("head", parts.head.dtype),
                ("offsets", parts.offset_points.dtype, (length,)),
                ("vals_head", parts.vals_head.dtype),
                ("vals", parts.value_points.dtype, (length,)),
            ]
        )
        table = np.empty(len(rows), layout)
        table["head"] = parts.head[rows]
        table["offsets"] = parts.offset_points[points]
        table["vals_head"] = parts.vals_head[rows]
        table["vals"] = parts.value_points[points]
        chunks.append(table.tobytes())
    chunks.append(TRAILER)
    return b"".join(chunks)
