"""The step chunk format (apps/runs/chunks.py) alone: durations to the microsecond stored as
integers and returned bit for bit, other floats kept as they are, and chunks written in
format 1 (full-precision durations, before ingest rounded them) still read."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from apps.core.bounds import SECONDS_MAX
from apps.runs import chunks
from apps.runs.chunks import (
    DURATION_DECIMALS,
    DURATION_FIELDS,
    FORMAT_VERSION,
    MODE_FLOATS,
    MODE_MICROS,
    MODE_MICROS_PREDICTED,
    MODE_XOR_PREDICTED,
    chunk_decode,
    chunk_encode,
)

DATA = Path(__file__).parent / "data"
AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
# The block of each column in a chunk (chunk_encode's order): ts, ints, floats, comm_wait.
BLOCK = {
    name: index
    for index, name in enumerate(["ts", *chunks.INT_COLUMNS, *chunks.FLOAT_COLUMNS, "comm_wait"])
}

# What steps_store stores: a duration rounded to the microsecond, anywhere in the bounds
stored_seconds = st.one_of(
    st.sampled_from([0.0, 1e-6, 0.5e-6, 0.123457, 1.0, SECONDS_MAX, SECONDS_MAX - 1e-6]),
    st.floats(min_value=0, max_value=SECONDS_MAX),
    st.integers(min_value=0, max_value=int(SECONDS_MAX * 1e6)).map(lambda n: n / 1e6),
).map(lambda s: round(s, DURATION_DECIMALS))
any_float = st.floats(allow_nan=True, allow_infinity=True)


def bits(value: float | None) -> int | None:
    return None if value is None else struct.unpack("<q", struct.pack("<d", value))[0]


def row(i: int, **durations: float | None) -> dict:
    """A report with the given durations; the rest plain (loss full precision)."""
    return {
        "run_id": 1, "rank": 0, "ts": AT + timedelta(seconds=i), "node_id": 2, "step": i,
        **{name: durations.get(name) for name in DURATION_FIELDS},
        "tokens": 4096, "loss": 2 + 1 / (3 + i), "grad_checksum": None, "param_checksum": None,
        "canary_norm": None, "canary_proj": None, "shard": None, "gpu": 0,
    }  # fmt: skip


def as_bits(rows: list[dict]) -> list[list]:
    """Every field, floats as their bits: equal means bit for bit (-0.0 is not 0.0)."""
    return [sorted((k, bits(v) if isinstance(v, float) else v) for k, v in r.items()) for r in rows]


def mode(data: bytes, name: str) -> bytes:
    return chunks._unblocks(data, 1)[BLOCK[name]][:1]


@given(
    values=st.lists(
        st.fixed_dictionaries({name: st.none() | stored_seconds for name in DURATION_FIELDS}),
        min_size=1,
        max_size=50,
    )
)
@hypothesis_settings(max_examples=300, deadline=None)
def test_it_returns_microsecond_durations_bit_for_bit_as_integers(values):
    rows = [row(i, **v) for i, v in enumerate(values)]

    data = chunk_encode(rows)

    assert data[0] == FORMAT_VERSION == 2
    assert as_bits(chunk_decode(data, run_id=1, rank=0)) == as_bits(rows)
    for name in DURATION_FIELDS[:-1]:
        assert mode(data, name) == MODE_MICROS  # never the float fallback for stored values
    assert mode(data, "comm_wait") in (MODE_MICROS, MODE_MICROS_PREDICTED)


@given(seconds=stored_seconds)
@hypothesis_settings(max_examples=1000, deadline=None)
def test_a_microsecond_count_over_1e6_is_the_stored_double(seconds):
    assert bits(round(seconds * 1e6) / 1e6) == bits(seconds)
    assert bits(round(seconds, DURATION_DECIMALS)) == bits(seconds)


@given(
    phases=st.lists(
        st.tuples(stored_seconds, stored_seconds, stored_seconds, stored_seconds),
        min_size=1,
        max_size=40,
    )
)
@hypothesis_settings(max_examples=300, deadline=None)
def test_it_returns_comm_wait_stored_against_its_prediction_exactly(phases):
    rows = [
        row(
            i, step_time=s, data_time=d, h2d_time=h, compute_time=c,
            comm_wait=round(s - (d + h + c), DURATION_DECIMALS),
        )
        for i, (s, d, h, c) in enumerate(phases)
    ]  # fmt: skip

    data = chunk_encode(rows)

    assert as_bits(chunk_decode(data, run_id=1, rank=0)) == as_bits(rows)


def test_it_stores_a_usual_comm_wait_against_its_prediction():
    rows = []
    for i in range(300):
        data_time, h2d, compute = (round(x, 6) for x in (0.05 + i / 7e4, 0.01, 0.6 + i / 3e5))
        step_time = round(0.95 + (i % 7) / 700, 6)
        comm = round(step_time - (data_time + h2d + compute), 6)
        rows.append(row(i, step_time=step_time, data_time=data_time, h2d_time=h2d,
                        compute_time=compute, comm_wait=comm))  # fmt: skip

    data = chunk_encode(rows)

    assert mode(data, "comm_wait") == MODE_MICROS_PREDICTED
    assert as_bits(chunk_decode(data, run_id=1, rank=0)) == as_bits(rows)


@given(
    values=st.lists(
        st.fixed_dictionaries({name: st.none() | any_float for name in DURATION_FIELDS}),
        min_size=1,
        max_size=30,
    )
)
@hypothesis_settings(max_examples=300, deadline=None)
def test_it_keeps_durations_that_are_not_whole_microseconds_bit_for_bit(values):
    # reports stored before ingest rounded, and a chunk of format 1 unsealed and compacted again
    rows = [row(i, **v) for i, v in enumerate(values)]

    decoded = chunk_decode(chunk_encode(rows), run_id=1, rank=0)

    assert as_bits(decoded) == as_bits(rows)


def test_a_column_with_one_unrounded_value_keeps_its_floats():
    rows = [row(0, step_time=0.5), row(1, step_time=0.1234567891), row(2, step_time=-0.0)]

    data = chunk_encode(rows)

    assert mode(data, "step_time") == MODE_FLOATS
    assert as_bits(chunk_decode(data, run_id=1, rank=0)) == as_bits(rows)


def v1_rows() -> list[dict]:
    """The reports tests/runs/data/step_chunk_v1_xor.bin was encoded from, in format 1:
    full-precision durations, comm_wait the XOR with its float prediction."""
    out = []
    for i in range(4):
        data, h2d, compute = 0.05 + i / 7e3, 0.01 + i / 3e4, 0.6 + i / 51
        step = 0.98 + (i % 3) / 41
        out.append({
            "run_id": 7, "rank": 3, "ts": AT + timedelta(seconds=i, microseconds=i * 13),
            "node_id": 11, "step": 100 + i, "step_time": step, "data_time": data,
            "h2d_time": h2d, "compute_time": compute, "comm_wait": step - (data + h2d + compute),
            "tokens": 4096, "loss": 2 + 8 / (10 + i),
            "grad_checksum": "ab" * 32 if i == 2 else None, "param_checksum": None,
            "canary_norm": 3.5 if i == 2 else None,
            "canary_proj": [0.25, -1e-7] if i == 2 else None, "shard": "dp3", "gpu": 3,
        })  # fmt: skip
    return out


def v1_edge_rows() -> list[dict]:
    """The reports of step_chunk_v1_edges.bin: test_the_chunk_format_keeps_edge_values's."""
    return [
        {"run_id": 1, "rank": 0, "ts": AT + timedelta(microseconds=i), "node_id": 2**40,
         "step": -5 + i, "step_time": 5e-324 if i else 1e308, "data_time": None,
         "h2d_time": -0.0, "compute_time": 0.1, "comm_wait": None if i == 1 else 0.3,
         "tokens": None if i else 2**62, "loss": float("inf") if i == 2 else 2.5,
         "grad_checksum": "" if i == 0 else None, "param_checksum": "é" * 3,
         "canary_norm": None, "canary_proj": [] if i == 0 else None, "shard": None,
         "gpu": None}
        for i in range(3)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "rows", "run_id", "rank", "comm_mode"),
    [
        ("step_chunk_v1_xor.bin", v1_rows(), 7, 3, MODE_XOR_PREDICTED),
        ("step_chunk_v1_edges.bin", v1_edge_rows(), 1, 0, MODE_FLOATS),
    ],
)
def test_it_still_reads_chunks_of_format_1(name, rows, run_id, rank, comm_mode):
    # bytes written by the format 1 encoder (commit e056d2f), kept as they were
    old = (DATA / name).read_bytes()
    assert old[0] == 1 and mode(old, "comm_wait") == comm_mode

    decoded = chunk_decode(old, run_id=run_id, rank=rank)

    assert as_bits(decoded) == as_bits(rows)
    # unsealed and compacted again: format 2, the same reports
    again = chunk_encode(decoded)
    assert again[0] == 2
    assert as_bits(chunk_decode(again, run_id=run_id, rank=rank)) == as_bits(rows)


def test_it_refuses_a_format_it_does_not_know():
    data = chunk_encode([row(0, step_time=1.0)])

    with pytest.raises(ValueError, match="unknown step chunk format 9"):
        chunk_decode(bytes([9]) + data[1:], run_id=1, rank=0)
