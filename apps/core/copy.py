"""PostgreSQL's binary COPY format, built from numpy arrays instead of row by row.

psycopg's `write_row` dumps each value in Python; for the ingest path's many small rows that
cost more than the rows' storage. A stream here is: SIGNATURE, then per row the field count
and per field its byte length and value in binary send form (big-endian), then TRAILER
(PostgreSQL docs: "COPY", "Binary Format"). Write it with `copy.write(stream)` into
`COPY table (columns) FROM STDIN (FORMAT BINARY)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # the signature, no flags, no header extension
TRAILER = b"\xff\xff"
UNIX_TO_PG_EPOCH_S = 946_684_800  # 2000-01-01, the epoch of timestamptz's binary form

# the column types this module writes, as numpy's big-endian types of their send form
TYPES = {"int2": ">i2", "int4": ">i4", "int8": ">i8", "float8": ">f8", "timestamptz": ">i8"}


def pg_microseconds(seconds: np.ndarray) -> np.ndarray:
    """Unix seconds as timestamptz's binary form (int64 µs since 2000-01-01), rounded as
    `datetime.fromtimestamp` rounds them (fraction × 10⁶, half to even), so a row written
    here holds the same instant as one written through `apps.core.times.to_datetime`."""
    seconds = np.asarray(seconds, dtype=np.float64)
    whole = np.trunc(seconds)
    micros = np.rint((seconds - whole) * 1e6)
    return (whole.astype(np.int64) - UNIX_TO_PG_EPOCH_S) * 1_000_000 + micros.astype(np.int64)


def send_form(
    columns: Sequence[tuple[str, np.ndarray | Sequence]],
    *,
    field_count: int | None = None,
    tail: Sequence[str] = (),
) -> np.ndarray:
    """One structured record per value of the columns, packed big-endian: the row's field
    count when given, then each column's byte length and value (type name from TYPES; a
    timestamptz's values are pg_microseconds), then `tail` int4 fields left at zero for the
    caller (an array's header, say)."""
    rows = len(columns[0][1]) if columns else 0
    layout = (
        ([("fields", ">i2")] if field_count is not None else [])
        + [
            (part, TYPES[kind] if part.startswith("v") else ">i4")
            for index, (kind, _) in enumerate(columns)
            for part in (f"n{index}", f"v{index}")
        ]
        + [(name, ">i4") for name in tail]
    )
    table = np.zeros(rows, np.dtype(layout))
    if field_count is not None:
        table["fields"] = field_count
    for index, (kind, values) in enumerate(columns):
        table[f"n{index}"] = np.dtype(TYPES[kind]).itemsize
        table[f"v{index}"] = values
    return table


def fixed_rows_binary(columns: Sequence[tuple[str, np.ndarray | Sequence]]) -> bytes:
    """The COPY stream of rows whose columns are all fixed-width and not null, given as
    (type name from TYPES, values) in the table's column order."""
    return SIGNATURE + send_form(columns, field_count=len(columns)).tobytes() + TRAILER
