"""The columnar form of step reports (`runs_stepchunk.data`): pure encode/decode, no database.

A chunk holds one rank's reports of one run in one STEP_CHUNK_SECONDS window. Its `data` is a
version byte and then one length-prefixed block per column, in COLUMNS order. Numbers go
through apps.core.codec; a nullable column is a null bitmap (empty when none is null) and
its present values; text columns (checksums, shard) are a JSON dictionary of their distinct
values and an int column of indexes (0: null); canary_proj is an int column of lengths (-1:
null) and the flattened floats. comm_wait is usually step_time less the other phases, so it
is stored as the XOR of its bits with that prediction when that is smaller (lossless: the
prediction is recomputed bit for bit on decode).
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

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
FORMAT_VERSION = 1
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


def _predicted_comm(row: Row) -> float:
    return row["step_time"] - (row["data_time"] + row["h2d_time"] + row["compute_time"])


def _comm_block(rows: list[Row]) -> bytes:
    """comm_wait: mode 0 (a nullable float column) or 1 (XOR with the prediction, when every
    row has all phases), whichever is smaller."""
    values = [row["comm_wait"] for row in rows]
    plain = b"\0" + _blocks([_mask(values), _floats([v for v in values if v is not None])])
    if all(row[f] is not None for row in rows for f in (*_PHASES, "comm_wait")):
        xored = [_bits(row["comm_wait"]) ^ _bits(_predicted_comm(row)) for row in rows]
        predicted = b"\1" + _ints(xored)
        if len(predicted) < len(plain):
            return predicted
    return plain


def _uncomm(block: bytes, rows: list[Row]) -> None:
    if block[:1] == b"\1":
        for row, xored in zip(rows, _unints(block[1:]), strict=True):
            row["comm_wait"] = _float_of(_bits(_predicted_comm(row)) ^ xored)
        return
    mask, present = _unblocks(block, 1)
    for row, value in zip(rows, _with_nulls(mask, _unfloats(present), len(rows)), strict=True):
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
        parts.append(_nullable([row[name] for row in rows], _floats))
    parts.append(_comm_block(rows))
    for name in TEXT_COLUMNS:
        parts.append(_text_block([row[name] for row in rows]))
    parts.append(_proj_block([row["canary_proj"] for row in rows]))
    return bytes([FORMAT_VERSION]) + _blocks(parts)


def chunk_decode(data: bytes, *, run_id: int, rank: int) -> list[Row]:
    """The reports of a chunk, as chunk_encode was given them (dicts of STEP_FIELDS)."""
    if data[0] != FORMAT_VERSION:
        raise ValueError(f"unknown step chunk format {data[0]}")
    blocks = iter(_unblocks(data, 1))
    stamps = _unints(next(blocks))
    n = len(stamps)
    rows: list[Row] = [
        {"run_id": run_id, "rank": rank, "ts": from_micros(stamp)} for stamp in stamps
    ]
    numeric = [*((c, _unints) for c in INT_COLUMNS), *((c, _unfloats) for c in FLOAT_COLUMNS)]
    for name, decode in numeric:
        mask, present = _unblocks(next(blocks), 0)
        for row, value in zip(rows, _with_nulls(mask, decode(present), n), strict=True):
            row[name] = value
    _uncomm(next(blocks), rows)
    for name in TEXT_COLUMNS:
        for row, value in zip(rows, _untext(next(blocks)), strict=True):
            row[name] = value
    for row, value in zip(rows, _unproj(next(blocks), n), strict=True):
        row["canary_proj"] = value
    return rows
