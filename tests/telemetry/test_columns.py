"""A drain's samples as sorted columns (apps/telemetry/columns.py) hold what per-series lists of
sorted (ts, value) tuples held, and each row's min, max and sum are a loop's over its values."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from apps.telemetry.chunk_copy import row_stats
from apps.telemetry.columns import columns_from_dicts, columns_from_records
from apps.telemetry.models import HOST_GPU

NOW = 1_795_000_000.0


def tuples_grouped(parts):
    """The grouping the worker did before: per series a list of (ts, value), sorted."""
    series = defaultdict(list)
    for node_id, samples in parts:
        for sample in samples:
            gpu = sample.get("gpu")
            key = (node_id, sample["metric"], HOST_GPU if gpu is None else gpu)
            series[key].append((sample["ts"], sample["value"]))
    for points in series.values():
        points.sort()
    return series


samples = st.fixed_dictionaries(
    {
        # few distinct times and values: equal stamps, and ties broken by value
        "ts": st.one_of(st.sampled_from([NOW, NOW + 1, NOW + 0.5]), st.integers(0, 3).map(
            lambda k: int(NOW) + k)),
        "metric": st.sampled_from(["gpu.util", "gpu.temp", "host.load"]),
        "value": st.one_of(st.sampled_from([0.0, -0.0, 1.5, -2.0, 7]), st.floats(-1e9, 1e9)),
    },
    optional={"gpu": st.one_of(st.none(), st.integers(0, 3))},
)  # fmt: skip
drains = st.lists(st.tuples(st.integers(1, 4), st.lists(samples, max_size=30)), max_size=6)


@given(parts=drains)
def test_the_columns_hold_the_sorted_series_of_the_tuples(parts):
    expected = tuples_grouped(parts)
    columns = columns_from_dicts(parts)
    assert columns.keys == list(expected)  # first seen first
    assert columns.count == sum(len(points) for points in expected.values())
    for index, key in enumerate(columns.keys):
        points = expected[key]
        assert columns.points(index) == [(float(ts), float(value)) for ts, value in points]
        # the newest point as sent (an int stays an int); equal floats: any of them
        ts, value = columns.latest[index]
        assert (ts, value) == points[-1] and type(ts) is type(points[-1][0])


@given(parts=drains)
def test_records_and_dicts_give_the_same_columns(parts):
    records = [
        (node, [SimpleNamespace(**{"gpu": None, **sample}) for sample in batch])
        for node, batch in parts
    ]
    ours, theirs = columns_from_records(records), columns_from_dicts(parts)
    assert ours.keys == theirs.keys and ours.latest == theirs.latest
    assert np.array_equal(ours.bounds, theirs.bounds)
    assert ours.times.tobytes() == theirs.times.tobytes()
    assert ours.values.tobytes() == theirs.values.tobytes()


def loop_stats(values):
    low = high = values[0]
    total = 0.0
    for value in values:
        low = value if value < low else low
        high = value if value > high else high
        total += value
    return low, high, total


rows = st.lists(
    st.lists(
        st.one_of(st.floats(-1e150, 1e150), st.sampled_from([0.0, -0.0, 1e-300, 3.0])),
        min_size=1,
        max_size=70,  # past the vectorised limit (32): those rows go one by one
    ),
    min_size=1,
    max_size=20,
)


@given(rows=rows)
def test_row_stats_are_those_of_a_loop_bit_for_bit(rows):
    values = np.array([value for row in rows for value in row])
    lengths = np.array([len(row) for row in rows])
    starts = np.cumsum(lengths) - lengths
    vmin, vmax, vsum = row_stats(values, starts=starts, lengths=lengths)
    ours = [np.array(triple).tobytes() for triple in zip(vmin, vmax, vsum, strict=True)]
    assert ours == [np.array(loop_stats(row)).tobytes() for row in rows]


def test_the_first_of_equal_extremes_wins_as_in_min_and_max():
    values = np.array([0.0, -0.0, -0.0, 0.0])
    vmin, vmax, vsum = row_stats(values, starts=np.array([0, 2]), lengths=np.array([2, 2]))
    assert [np.signbit(v) for v in vmin] == [False, True]  # min([0.0, -0.0]) is 0.0
    assert [np.signbit(v) for v in vmax] == [False, True]
    assert not any(np.signbit(v) for v in vsum)  # a sum starts from 0: 0 + -0.0 = 0.0
