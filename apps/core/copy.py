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


def fixed_rows_binary(columns: Sequence[tuple[str, np.ndarray | Sequence]]) -> bytes:
    """The COPY stream of rows whose columns are all fixed-width and not null, given as
    (type name from TYPES, values) in the table's column order; a timestamptz column's
    values are pg_microseconds."""
    rows = len(columns[0][1]) if columns else 0
    layout = np.dtype(
        [("fields", ">i2")]
        + [
            (part, TYPES[kind] if part.startswith("v") else ">i4")
            for index, (kind, _) in enumerate(columns)
            for part in (f"n{index}", f"v{index}")
        ]
    )
    table = np.empty(rows, layout)
    table["fields"] = len(columns)
    for index, (kind, values) in enumerate(columns):
        table[f"n{index}"] = np.dtype(TYPES[kind]).itemsize
        table[f"v{index}"] = values
    return SIGNATURE + table.tobytes() + TRAILER
