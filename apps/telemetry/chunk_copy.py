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

INT4_OID, FLOAT8_OID = 23, 701
INT4_MAX = 2**31 - 1

# an array's header after its byte length: ndim, has-nulls, element type oid, length, lower
# bound; the chunk row's offsets array begins in its head, its values array in its own
_ARRAY_HEAD = ("len", "ndim", "nulls", "oid", "dim", "lower")
_VALS_HEAD = np.dtype([(name, ">i4") for name in _ARRAY_HEAD])
_ARRAY_HEAD_BYTES = 20  # ndim, has-nulls, oid, length, lower bound

Key = tuple[int, str, int]


class SeriesRanges(NamedTuple):
    """Per series written: its key and the timestamptz (pg_microseconds) of its first and
    last point, as arrays in the order of the rows."""

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


def chunk_rows_binary(
    *, series: dict[Key, list[tuple[float, float]]], metric_ids: dict[str, int]
) -> ChunkRows:
    """One row per series (its points sorted by time) for `telemetry_chunk`'s CHUNK_COLUMNS:
    points as offsets in ms from the first (rounded half to even, as `round`) and floats."""
    keys = list(series)
    lengths = np.fromiter((len(points) for points in series.values()), np.int64, len(keys))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    times = np.fromiter((ts for points in series.values() for ts, _ in points), np.float64)
    values = [float(value) for points in series.values() for _, value in points]
    vals = np.array(values, dtype=np.float64)

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
    # Python's own min, max and sum (left to right) of each row, as before: numpy's pairwise
    # sum can differ in the last bit, its minimum may pick -0.0 over an equal 0.0
    bounds = list(zip(starts.tolist(), ends.tolist(), strict=True))
    head = send_form(
        [
            ("int4", ranges.node_ids),
            ("int4", ranges.metric_ids),
            ("int2", ranges.gpus),
            ("timestamptz", ranges.t0s),
            ("timestamptz", ranges.t1s),
            ("int4", lengths),
            ("float8", [min(values[start:end]) for start, end in bounds]),
            ("float8", [max(values[start:end]) for start, end in bounds]),
            ("float8", [sum(values[start:end]) for start, end in bounds]),
        ],
        field_count=11,
        tail=[f"offsets_{name}" for name in _ARRAY_HEAD],
    )
    _array_head(head, prefix="offsets_", oid=INT4_OID, lengths=lengths, element_bytes=8)
    vals_head = np.zeros(len(keys), _VALS_HEAD)
    _array_head(vals_head, prefix="", oid=FLOAT8_OID, lengths=lengths, element_bytes=12)

    return ChunkRows(
        _interleave(
            head,
            send_form([("int4", offsets)]),
            vals_head,
            send_form([("float8", vals)]),
            bounds,
        ),
        len(values),
        ranges,
    )


def _array_head(
    head: np.ndarray, *, prefix: str, oid: int, lengths: np.ndarray, element_bytes: int
) -> None:
    head[f"{prefix}len"] = _ARRAY_HEAD_BYTES + lengths * element_bytes
    head[f"{prefix}ndim"], head[f"{prefix}oid"], head[f"{prefix}lower"] = 1, oid, 1
    head[f"{prefix}dim"] = lengths


def _interleave(
    head: np.ndarray,
    offset_points: np.ndarray,
    vals_head: np.ndarray,
    value_points: np.ndarray,
    bounds: list[tuple[int, int]],
) -> bytes:
    """signature, (head, offsets, values head, values) per row, trailer."""
    heads, offsets = memoryview(head.tobytes()), memoryview(offset_points.tobytes())
    vals_heads, values = memoryview(vals_head.tobytes()), memoryview(value_points.tobytes())
    head_size, vals_head_size = head.dtype.itemsize, _VALS_HEAD.itemsize
    parts: list[bytes | memoryview] = [SIGNATURE]
    for row, (start, end) in enumerate(bounds):
        parts += (
            heads[row * head_size : (row + 1) * head_size],
            offsets[start * 8 : end * 8],
            vals_heads[row * vals_head_size : (row + 1) * vals_head_size],
            values[start * 12 : end * 12],
        )
    parts.append(TRAILER)
    return b"".join(parts)
