"""The columnar form of step reports (`runs_stepchunk.data`): pure encode/decode, no database.

A chunk holds one rank's reports of one run in one STEP_CHUNK_SECONDS window. Its `data` is a
version byte and then one length-prefixed block per column, in COLUMNS order. Numbers go
through apps.core.codec; a nullable column is a null bitmap (empty when none is null) and
its present values; text columns (checksums, shard) are a JSON dictionary of their distinct
values and an int column of indexes (0: null); canary_proj is an int column of lengths (-1:
null) and the flattened floats.

Durations (DURATION_FIELDS) are stored to the microsecond (steps_store rounds them), so a
duration column is a mode byte and then integer microseconds (MODE_MICROS): random mantissa
bits cost ≈ 6 B a value, microseconds ≈ 2. A column with a value that is not a whole number
of microseconds (a report stored before ingest rounded, -0.0) keeps its floats (MODE_FLOATS):
a chunk returns every value bit for bit. comm_wait is usually step_time less the other
phases, so it is stored as its difference from that prediction in microseconds when that is
smaller (MODE_MICROS_PREDICTED: ≈ 0.3 B a value).

Format 1 (before durations were rounded) had no mode byte on the four phase columns and
stored comm_wait as floats (MODE_FLOATS) or as the XOR of its bits with the float prediction
(MODE_XOR_PREDICTED); chunks in it are still read, none is written.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from apps.core.codec import floats_decode, floats_encode, ints_decode, ints_encode

# Every column of a step report, in the order of runs_stepreport's COPY (run_id first).
STEP_FIELDS = [
    "run_id",
    "node_id",
    "ts",
    "rank",
    "step",
    "step_time",
    "data_time",
    "h2d_time",
    "compute_time",
    "comm_wait",
    "tokens",
    "loss",
    "grad_checksum",
    "param_checksum",
    "canary_norm",
    "canary_proj",
    "shard",
    "gpu",
]
INT_COLUMNS = ("node_id", "step", "tokens", "gpu")
FLOAT_COLUMNS = ("step_time", "data_time", "h2d_time", "compute_time", "loss", "canary_norm")
TEXT_COLUMNS = ("grad_checksum", "param_checksum", "shard")
_PHASES = ("data_time", "h2d_time", "compute_time")
# Stored to the microsecond: rounded to DURATION_DECIMALS at ingest, integers in a chunk.
DURATION_FIELDS = ("step_time", *_PHASES, "comm_wait")
DURATION_DECIMALS = 6
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
MODE_FLOATS, MODE_XOR_PREDICTED, MODE_MICROS, MODE_MICROS_PREDICTED = b"\0", b"\1", b"\2", b"\3"
# Microsecond counts stay exact integers in a double below 2**53: 9e9 s, past SECONDS_MAX.
_MICROS_MAX_S = 2**53 / 1e6
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Row = dict[str, Any]


def to_micros(ts: datetime) -> int:
    delta = ts - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    seconds, micros = divmod(value, 1_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=micros)


def _blocks(parts: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(part)) + part for part in parts)


def _unblocks(data: bytes, offset: int) -> list[bytes]:
    parts = []
    while offset < len(data):
        (size,) = struct.unpack_from("<I", data, offset)
        parts.append(data[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return parts


def _ints(values: list[int]) -> bytes:
    return ints_encode(values) if values else b""


def _unints(data: bytes) -> list[int]:
    return ints_decode(data).tolist() if data else []


def _floats(values: list[float]) -> bytes:
    return floats_encode(values) if values else b""


def _unfloats(data: bytes) -> list[float]:
    return floats_decode(data).tolist() if data else []


def _mask(values: list[Any]) -> bytes:
    if all(v is not None for v in values):
        return b""
    out = bytearray((len(values) + 7) // 8)
    for index, value in enumerate(values):
        if value is None:
            out[index // 8] |= 1 << (index % 8)
    return bytes(out)


def _nulls(mask: bytes, n: int) -> list[bool]:
    if not mask:
        return [False] * n
    return [bool(mask[i // 8] >> (i % 8) & 1) for i in range(n)]


def _with_nulls(mask: bytes, present: list[Any], n: int) -> list[Any]:
    values = iter(present)
    return [None if null else next(values) for null in _nulls(mask, n)]


def _bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value))[0]


def _float_of(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _micros(values: list[float]) -> np.ndarray | None:
    """The values as integer microseconds, or None when one is not a whole number of them.
    Bit for bit: n / 1e6 is the double nearest n µs, the double round(x, 6) gives."""
    seconds = np.asarray(values, dtype=np.float64)
    if not np.isfinite(seconds).all() or (seconds.size and np.abs(seconds).max() > _MICROS_MAX_S):
        return None
    micros = np.rint(seconds * 1e6).astype(np.int64)
    return micros if np.array_equal((micros / 1e6).view(np.int64), seconds.view(np.int64)) else None


def _unmicros(data: bytes) -> list[float]:
    return (ints_decode(data) / 1e6).tolist() if data else []


def _duration_block(values: list[float | None]) -> bytes:
    present = [v for v in values if v is not None]
    micros = _micros(present)
    if micros is None:
        return MODE_FLOATS + _blocks([_mask(values), _floats(present)])
    return MODE_MICROS + _blocks([_mask(values), _ints(micros.tolist())])


def _unduration(block: bytes, n: int) -> list[float | None]:
    mask, present = _unblocks(block, 1)
    decode = _unmicros if block[:1] == MODE_MICROS else _unfloats
    return _with_nulls(mask, decode(present), n)


def _predicted_comm(row: Row) -> float:
    return row["step_time"] - (row["data_time"] + row["h2d_time"] + row["compute_time"])


def _predicted_comm_micros(rows: list[Row]) -> np.ndarray | None:
    """step_time less the other phases, in microseconds, or None when a row lacks a phase or
    one is not a whole number of microseconds."""
    if any(row[f] is None for row in rows for f in ("step_time", *_PHASES)):
        return None
    step, data, h2d, compute = (_micros([row[f] for row in rows]) for f in ("step_time", *_PHASES))
    if step is None or data is None or h2d is None or compute is None:
        return None
    return step - (data + h2d + compute)


def _comm_block(rows: list[Row]) -> bytes:
    """comm_wait: a duration column, or its difference from the prediction in microseconds
    (when every row has every phase, all whole microseconds), whichever is smaller."""
    values = [row["comm_wait"] for row in rows]
    plain = _duration_block(values)
    comm = None if None in values else _micros(values)
    predicted = _predicted_comm_micros(rows)
    if comm is not None and predicted is not None:
        against = MODE_MICROS_PREDICTED + _ints((comm - predicted).tolist())
        if len(against) < len(plain):
            return against
    return plain


def _uncomm(block: bytes, rows: list[Row]) -> None:
    mode = block[:1]
    if mode == MODE_XOR_PREDICTED:  # format 1
        for row, xored in zip(rows, _unints(block[1:]), strict=True):
            row["comm_wait"] = _float_of(_bits(_predicted_comm(row)) ^ xored)
        return
    if mode == MODE_MICROS_PREDICTED:
        predicted = _predicted_comm_micros(rows)
        assert predicted is not None  # the encoder checked every phase is whole µs
        residual = ints_decode(block[1:]) if len(block) > 1 else np.zeros(0, np.int64)
        for row, value in zip(rows, ((predicted + residual) / 1e6).tolist(), strict=True):
            row["comm_wait"] = value
        return
    for row, value in zip(rows, _unduration(block, len(rows)), strict=True):
        row["comm_wait"] = value


def _text_block(values: list[str | None]) -> bytes:
    distinct = sorted({v for v in values if v is not None})
    index = {value: i + 1 for i, value in enumerate(distinct)}
    return _blocks([orjson.dumps(distinct), _ints([0 if v is None else index[v] for v in values])])


def _untext(block: bytes) -> list[str | None]:
    names, indexes = _unblocks(block, 0)
    distinct = [None, *orjson.loads(names)]
    return [distinct[i] for i in _unints(indexes)]


def _proj_block(values: list[list[float] | None]) -> bytes:
    lengths = [-1 if v is None else len(v) for v in values]
    if all(length == -1 for length in lengths):
        return b""
    flat = [float(x) for v in values if v is not None for x in v]
    return _blocks([_ints(lengths), _floats(flat)])


def _unproj(block: bytes, n: int) -> list[list[float] | None]:
    if not block:
        return [None] * n
    lengths_block, flat_block = _unblocks(block, 0)
    flat, out, at = _unfloats(flat_block), [], 0
    for length in _unints(lengths_block):
        out.append(None if length < 0 else flat[at : at + length])
        at += max(length, 0)
    return out


def _nullable(values: list[Any], encode: Any) -> bytes:
    return _blocks([_mask(values), encode([v for v in values if v is not None])])


def chunk_encode(rows: list[Row]) -> bytes:
    """The `data` of a chunk of one run's and rank's reports (dicts of STEP_FIELDS; ts an
    aware datetime), kept in the order given."""
    parts = [_ints([to_micros(row["ts"]) for row in rows])]
    for name in INT_COLUMNS:
        parts.append(_nullable([row[name] for row in rows], _ints))
    for name in FLOAT_COLUMNS:
        values = [row[name] for row in rows]
        duration = name in DURATION_FIELDS
        parts.append(_duration_block(values) if duration else _nullable(values, _floats))
    parts.append(_comm_block(rows))
    for name in TEXT_COLUMNS:
        parts.append(_text_block([row[name] for row in rows]))
    parts.append(_proj_block([row["canary_proj"] for row in rows]))
    return bytes([FORMAT_VERSION]) + _blocks(parts)


def chunk_decode(data: bytes, *, run_id: int, rank: int) -> list[Row]:
    """The reports of a chunk, as chunk_encode was given them (dicts of STEP_FIELDS)."""
    version = data[0]
    if version not in READ_VERSIONS:
        raise ValueError(f"unknown step chunk format {version}")
    blocks = iter(_unblocks(data, 1))
    stamps = _unints(next(blocks))
    n = len(stamps)
    rows: list[Row] = [
        {"run_id": run_id, "rank": rank, "ts": from_micros(stamp)} for stamp in stamps
    ]
    for name in (*INT_COLUMNS, *FLOAT_COLUMNS):
        block = next(blocks)
        values: list[Any]
        if version > 1 and name in DURATION_FIELDS:
            values = _unduration(block, n)
        else:
            mask, present = _unblocks(block, 0)
            values = _with_nulls(mask, (_unints if name in INT_COLUMNS else _unfloats)(present), n)
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    _uncomm(next(blocks), rows)
    for name in TEXT_COLUMNS:
        for row, text in zip(rows, _untext(next(blocks)), strict=True):
            row[name] = text
    for row, proj in zip(rows, _unproj(next(blocks), n), strict=True):
        row["canary_proj"] = proj
    return rows
