"""The numpy-built COPY streams (apps/core/copy.py; chunk rows in apps/telemetry/chunk_copy.py)
store what psycopg's own per-row dump of the same values stores, bit for bit, on real
Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.core.bounds import FLOAT_ABS_MAX
from apps.core.copy import fixed_rows_binary, pg_microseconds
from apps.core.times import to_datetime
from apps.telemetry.chunk_copy import chunk_rows_binary
from apps.telemetry.columns import columns_from_dicts
from apps.telemetry.services import CHUNK_COLUMNS, CHUNK_TYPES

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 30, tzinfo=UTC).timestamp()
# every column as its binary send form: -0.0 and 0.0, or two NaN payloads, would differ
COMPARED = (
    "node_id, metric_id, gpu, t0, t1, n, float8send(vmin), float8send(vmax), float8send(vsum),"
    " offsets_ms, array(SELECT float8send(v) FROM unnest(vals) v)"
)

values = st.one_of(
    st.floats(-FLOAT_ABS_MAX, FLOAT_ABS_MAX, allow_nan=False),
    st.sampled_from([0.0, -0.0, 0.5, 1.5, 2.5, 1e-300, -1e-300]),
    st.integers(-(2**53), 2**53),
)
# seconds with sub-millisecond parts (rounding halves included) over up to a week
times = st.one_of(
    st.floats(NOW - 7 * 86400, NOW + 60, allow_nan=False),
    st.integers(int(NOW) - 7 * 86400, int(NOW)),
    st.integers(0, 10**6).map(lambda k: NOW - k * 0.0005),
)
# rows both sides of the vectorised statistics' limit (32 points)
points = st.lists(st.tuples(times, values), min_size=1, max_size=40).map(sorted)
keys = st.tuples(st.integers(1, 2**31 - 1), st.sampled_from(["gpu.util", "host.cpu"]),
                 st.integers(-1, 63))  # fmt: skip
series_dicts = st.dictionaries(keys, points, min_size=1, max_size=12)


def reference_rows(series, metric_ids):
    """The rows as samples_store built them for psycopg before (one write_row per series),
    the sum added left to right (as Python 3.11's `sum` of floats does)."""
    for (node_id, metric, gpu), pts in series.items():
        t0 = pts[0][0]
        vals = [float(value) for _, value in pts]
        offsets = [round((ts - t0) * 1000) for ts, _ in pts]
        yield (node_id, metric_ids[metric], gpu, to_datetime(t0), to_datetime(pts[-1][0]),
               len(pts), min(vals), max(vals), left_to_right(vals), offsets, vals)  # fmt: skip


def left_to_right(values):
    total = 0.0
    for value in values:
        total += value
    return total


def as_columns(series):
    """{(node, metric, gpu): sorted points} as the worker's columns of the same samples."""
    return columns_from_dicts(
        ((node, [{"ts": ts, "metric": metric, "gpu": gpu, "value": value} for ts, value in pts])
         for (node, metric, gpu), pts in series.items())
    )  # fmt: skip


def micros(value: datetime) -> int:
    return (value - datetime(2000, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def temp_tables(definition: str) -> None:
    """`ours` (our stream) and `theirs` (psycopg's rows), gone with the transaction."""
    with connection.cursor() as cursor:
        for table in ("ours", "theirs"):
            cursor.execute(f"CREATE TEMP TABLE {table} {definition} ON COMMIT DROP")


def stored(table: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {COMPARED} FROM {table} ORDER BY node_id, metric_id, gpu")
        return cursor.fetchall()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(series=series_dicts)
def test_the_stream_stores_what_psycopg_stored(series):
    metric_ids = {"gpu.util": 7, "host.cpu": 2**31 - 1}
    rows = chunk_rows_binary(series=as_columns(series), metric_ids=metric_ids)
    assert rows.count == sum(len(pts) for pts in series.values())
    ranges = list(zip(*(column.tolist() for column in rows.ranges), strict=True))
    assert ranges == [
        (*row[:3], micros(row[3]), micros(row[4])) for row in reference_rows(series, metric_ids)
    ]
    with transaction.atomic():
        temp_tables("(LIKE telemetry_chunk INCLUDING DEFAULTS)")
        raw = connection.connection
        with raw.cursor() as cursor:
            with cursor.copy(f"COPY ours {CHUNK_COLUMNS} FROM STDIN (FORMAT BINARY)") as copy:
                copy.write(rows.stream)
            with cursor.copy(f"COPY theirs {CHUNK_COLUMNS} FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(CHUNK_TYPES)
                for row in reference_rows(series, metric_ids):
                    copy.write_row(row)
        assert stored("ours") == stored("theirs")
        assert len(stored("ours")) == len(series)
        transaction.set_rollback(True)


def test_a_series_spanning_more_than_int4_milliseconds_is_refused():
    series = {(1, "gpu.util", 0): [(NOW - 25 * 86400, 1.0), (NOW, 2.0)]}
    with pytest.raises(ValueError, match="24 days"):
        chunk_rows_binary(series=as_columns(series), metric_ids={"gpu.util": 1})


@given(seconds=st.lists(times, max_size=50))
def test_pg_microseconds_rounds_as_fromtimestamp(seconds):
    assert pg_microseconds(seconds).tolist() == [micros(to_datetime(s)) for s in seconds]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**15), 2**15 - 1), times,
                  st.integers(-(2**63), 2**63 - 1)),
        max_size=30,
    )
)  # fmt: skip
def test_fixed_rows_store_what_psycopg_stored(rows):
    columns = [
        ("int4", [row[0] for row in rows]),
        ("int2", [row[1] for row in rows]),
        ("timestamptz", pg_microseconds([row[2] for row in rows])),
        ("int8", [row[3] for row in rows]),
    ]
    with transaction.atomic():
        temp_tables("(a int4, b int2, t timestamptz, c int8)")
        with connection.connection.cursor() as cursor:
            with cursor.copy("COPY ours FROM STDIN (FORMAT BINARY)") as copy:
                copy.write(fixed_rows_binary(columns))
            with cursor.copy("COPY theirs FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "int2", "timestamptz", "int8"])
                for a, b, ts, c in rows:
                    copy.write_row((a, b, to_datetime(ts), c))
            query = "SELECT array_agg(x ORDER BY a, b, t, c) FROM {} x"
            cursor.execute(query.format("ours"))
            ours = cursor.fetchone()
            cursor.execute(query.format("theirs"))
            assert ours == cursor.fetchone()
            cursor.execute("SELECT count(*) FROM ours")
            assert cursor.fetchone()[0] == len(rows)
        transaction.set_rollback(True)
