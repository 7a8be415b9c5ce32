"""Postgres int4[], int8[], float8[] and timestamptz[] columns fetched in binary, loaded as numpy
arrays: the chunk reads of a window, the compaction and the sealed-history export read
millions of points, which psycopg's own loaders would make into as many Python numbers."""

from __future__ import annotations

import struct

import numpy as np
import psycopg
from psycopg import postgres
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format

# Postgres's binary array format (array_send), read here and written by chunk_copy
INT4_OID, FLOAT8_OID = postgres.types["int4"].oid, postgres.types["float8"].oid
ARRAY_HEAD_BYTES = 20  # ndim, has-nulls, element oid, size, lower bound (one dimension)


class _ArrayLoader(Loader):
    """A one-dimensional array of fixed-size elements fetched in binary, as a numpy array:
    psycopg's own loader makes a Python object of every element (a window's read made
    millions, and the churn left the periodic worker's heap fragmented: docs/faults.md, 10)."""

    format = Format.BINARY
    element: np.dtype  # big-endian, as Postgres sends it
    native: type

    def load(self, data: Buffer) -> np.ndarray:
        # array_send: ndim, has-nulls flag, element oid, then (size, lower bound) per
        # dimension, then each element as (length, bytes)
        ndim, has_nulls = _ARRAY_HEAD.unpack_from(data)
        if ndim == 0:
            return np.empty(0, dtype=self.native)
        if ndim != 1 or has_nulls:
            raise ValueError("only one-dimensional arrays without NULLs load as numpy")
        (size,) = _INT4.unpack_from(data, 12)
        items = np.frombuffer(data, dtype=self.element, count=size, offset=ARRAY_HEAD_BYTES)
        return self.converted(items["value"])

    def converted(self, values: np.ndarray) -> np.ndarray:
        return values.astype(self.native)


class _Int4ArrayLoader(_ArrayLoader):
    element = np.dtype([("length", ">i4"), ("value", ">i4")])
    native = np.int64


class _Int8ArrayLoader(_ArrayLoader):
    element = np.dtype([("length", ">i4"), ("value", ">i8")])
    native = np.int64


class _Float8ArrayLoader(_ArrayLoader):
    element = np.dtype([("length", ">i4"), ("value", ">f8")])
    native = np.float64


class _TimestamptzArrayLoader(_ArrayLoader):
    """Loaded as float64 seconds since the Unix epoch: microseconds since 2000-01-01 (as
    Postgres sends them) moved to 1970, then divided, which gives the double nearest the
    exact seconds, as `date_part('epoch', t)` and `extract(epoch FROM t)::float8` do. The
    span read sends its chunks' starts so: the epoch in SQL was 100 ms of Postgres a pass
    at 16,384 ranks (apps.telemetry.selectors)."""

    element = np.dtype([("length", ">i4"), ("value", ">i8")])
    native = np.float64

    def converted(self, values: np.ndarray) -> np.ndarray:
        return (values + _POSTGRES_EPOCH_US).astype(np.float64) / 1e6


def arrays_joined(sent: bytes, counts: np.ndarray, element: str) -> np.ndarray:
    """The elements, as one numpy array, of one-dimensional arrays without NULLs of
    `counts[i]` elements each, as `string_agg(array_send(a), '')` joins them; `element` is
    their type, 'int4' or 'float8'. A node's many-point chunks so cost Postgres a copy of
    their arrays, where unnesting them cost it a row a point (apps.telemetry.selectors,
    _SPANS_SQL). Raises ValueError where the arrays are not what `counts` says."""
    oid, value, native = _JOINED[element]
    step = 4 + value.itemsize  # each element's length, then its bytes
    counts = np.asarray(counts, dtype=np.int64)
    # an empty array is sent with no dimension: ndim 0, has-nulls, oid
    heads_bytes = np.where(counts > 0, ARRAY_HEAD_BYTES, 12)
    sizes = heads_bytes + step * counts
    ends = np.cumsum(sizes)
    if counts.size == 0 or counts.min() < 0 or ends[-1] != len(sent):
        raise ValueError("joined arrays: their lengths are not the counts given")
    # Every field is 4 or 8 bytes at a multiple of 4: read as 4-byte words, an element is
    # one index (two for float8), not one a byte.
    words = np.frombuffer(sent, dtype=">u4")
    heads = (ends - sizes) // 4
    header = words[heads[:, None] + np.arange(3)].astype(np.int64)
    dims = words[heads[counts > 0, None] + np.arange(3, 5)].astype(np.int64)
    # one dimension (none when empty), no NULLs, the element type, the count, lower bound
    # 1: with the lengths summed above, every element is then of the element type's size
    if not (
        (header == np.outer(counts > 0, [1, 0, 0]) + [0, 0, oid]).all()
        and (dims[:, 0] == counts[counts > 0]).all()
        and (dims[:, 1] == 1).all()
    ):
        raise ValueError("joined arrays: a header does not match its count")
    # the i-th element of all, the k-th of its array: its array's first value's word + k
    # steps; k is i less the elements before its array
    total, stride = int(counts.sum()), step // 4
    firsts = heads + heads_bytes // 4 + 1 - (np.cumsum(counts) - counts) * stride
    at = np.repeat(firsts, counts) + np.arange(total) * stride
    if value.itemsize == 4:
        return words[at].view(value).astype(native)
    pairs = np.empty((total, 2), dtype=">u4")
    pairs[:, 0], pairs[:, 1] = words[at], words[at + 1]
    return pairs.view(value).ravel().astype(native)


# element type: its oid, numpy's dtype of it as sent, and as loaded (as _ArrayLoader's)
_JOINED = {
    "int4": (INT4_OID, np.dtype(">i4"), np.int64),
    "float8": (FLOAT8_OID, np.dtype(">f8"), np.float64),
}
_POSTGRES_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in microseconds since 1970
_ARRAY_HEAD = struct.Struct("!ii")
_INT4 = struct.Struct("!i")


def arrays_as_numpy(cursor: psycopg.Cursor) -> psycopg.Cursor:
    """`cursor`, loading int4[], int8[] and float8[] columns fetched in binary as numpy
    arrays, and timestamptz[] ones as float64 epoch seconds."""
    cursor.adapters.register_loader(postgres.types["int4"].array_oid, _Int4ArrayLoader)
    cursor.adapters.register_loader(postgres.types["int8"].array_oid, _Int8ArrayLoader)
    cursor.adapters.register_loader(postgres.types["float8"].array_oid, _Float8ArrayLoader)
    cursor.adapters.register_loader(
        postgres.types["timestamptz"].array_oid, _TimestamptzArrayLoader
    )
    return cursor
