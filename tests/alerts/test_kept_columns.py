"""A kept telemetry window's columns (apps.alerts.selectors.kept_columns) against a plain
model of what they hold: whatever spans a pass replaces, late or early, dense or thinned,
each pass hands on what the model says, and nothing handed on ever changes after."""

import math

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from apps.alerts.selectors.kept_columns import SeriesColumns, _left

METRICS = {5: "gpu.temp_c", 9: "gpu.util"}
NAMES = {1: "node-01", 2: "node-02", 3: "node-03"}
KEYS = [(node, metric, gpu) for node in NAMES for metric in METRICS for gpu in (-1, 1)]
Model = dict[tuple[int, int, int], list[tuple[float, float]]]

times = st.integers(0, 36).map(lambda half: half / 2)  # equal times and slots happen
# (key, ts, value, how far before ts its chunk starts): ties in time go by chunk start
point = st.tuples(
    st.sampled_from(KEYS), times, st.integers(-5, 5).map(float), st.sampled_from([0.0, 0.5, 3.0])
)
a_pass = st.tuples(
    st.dictionaries(st.sampled_from(list(NAMES)), st.tuples(st.integers(0, 16), st.integers(1, 6)),
                    min_size=1),
    st.lists(point, max_size=60),
    st.integers(0, 2),  # how far the window's start moves
)  # fmt: skip


def thinned(points: list[tuple], resolution: float) -> list[tuple[float, float]]:
    """(ts, value[, chunk start]) sorted by time, then chunk start, then as given; the newest
    of each slot."""
    ordered = [p[:2] for p in sorted(points, key=lambda p: (p[0], p[2] if len(p) > 2 else 0))]
    if resolution <= 0:
        return ordered
    out: list[tuple[float, float]] = []
    for ts, value in ordered:
        if out and math.floor(out[-1][0] / resolution) == math.floor(ts / resolution):
            out[-1] = (ts, value)
        else:
            out.append((ts, value))
    return out


def handed_by_model(model: Model, start: float, end: float, names: dict[int, str]):
    for key in list(model):
        model[key] = [p for p in model[key] if p[0] >= start]
        if not model[key]:
            del model[key]
    return [
        (names[key[0]], METRICS[key[1]], None if key[2] < 0 else key[2],
         [p for p in model[key] if p[0] < end])
        for key in sorted(model) if key[0] in names and any(p[0] < end for p in model[key])
    ]  # fmt: skip


@settings(max_examples=300, deadline=None)
@example(  # two points of one time: the one of the chunk that began first goes first
    first=[],
    passes=[({1: (0, 10)}, [((1, 5, 1), 5.0, 1.0, 0.0), ((1, 5, 1), 5.0, 2.0, 3.0)], 0)],
    resolution=0.0,
    names_drop=None,
)
@given(
    first=st.lists(point, max_size=40),
    passes=st.lists(a_pass, min_size=1, max_size=8),
    resolution=st.sampled_from([0.0, 1.0]),
    names_drop=st.sampled_from([None, 3]),
)
def test_each_pass_hands_on_what_the_model_holds_and_nothing_handed_changes(
    first, passes, resolution, names_drop
):
    names = {n: name for n, name in NAMES.items() if n != names_drop}
    start, end = 0.0, 8.0
    model: Model = {}
    for key, ts, value, _ in first:
        model.setdefault(key, []).append((ts, value))
    model = {key: thinned(points, resolution) for key, points in model.items()}
    columns = SeriesColumns(
        {key: (np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
         for key, pts in model.items()},
        METRICS,
    )  # fmt: skip
    handed_before: list[tuple[object, list[float], list[float]]] = []
    for spans_at, points, moved in [({}, [], 0), *passes]:
        spans = {node: (float(a), float(a + width)) for node, (a, width) in spans_at.items()}
        fresh = [(k, ts, v, ts - back) for k, ts, v, back in points if k[0] in spans]
        if spans:
            nodes, metric_ids, gpus = (np.array([p[0][i] for p in fresh], dtype=np.int64)
                                       for i in range(3))  # fmt: skip
            columns.replace_spans(
                spans,
                (nodes, metric_ids, gpus, np.array([p[3] for p in fresh]),
                 np.array([p[1] for p in fresh]), np.array([p[2] for p in fresh])),
                resolution,
            )  # fmt: skip
            for node, (a, b) in spans.items():
                for key in {k for k in [*model, *(p[0] for p in fresh)] if k[0] == node}:
                    new = [(ts, v, e0) for k, ts, v, e0 in fresh if k == key and a <= ts < b]
                    held = [p for p in model.get(key, []) if not a <= p[0] < b]
                    model[key] = sorted(held + thinned(new, resolution), key=lambda p: p[0])
        start, end = start + moved, end + moved + 1
        handed = columns.window(start=start, end=end, names=names)
        expected = handed_by_model(model, start, end, names)
        got = [(s.node, s.metric, s.gpu, list(zip(s.times.tolist(), s.values.tolist(),
                                                  strict=True))) for s in handed]  # fmt: skip
        assert got == expected
        assert columns.size == sum(len(p) for p in model.values())
        for series, ts, values in handed_before:
            assert series.times.tolist() == ts and series.values.tolist() == values
        handed_before += [(s, s.times.tolist(), s.values.tolist()) for s in handed]


def test_a_series_whose_window_did_not_move_is_handed_on_as_the_same_object():
    ts = np.arange(10.0)
    columns = SeriesColumns({(1, 5, 0): (ts, ts), (2, 5, 0): (ts, ts)}, METRICS)
    first = columns.window(start=0.0, end=20.0, names=NAMES)
    columns.replace_spans({2: (10.0, 12.0)}, (np.array([2, 2]), np.array([5, 5]),
                          np.array([0, 0]), np.array([10.0, 10.0]), np.array([10.0, 11.0]),
                          np.array([1.0, 2.0])), 1.0)  # fmt: skip
    second = columns.window(start=0.0, end=20.0, names=NAMES)
    assert second[0] is first[0]
    assert second[1] is not first[1] and second[1].times.tolist()[-2:] == [10.0, 11.0]
    assert first[1].times.tolist() == ts.tolist()


def test_points_of_one_time_go_by_their_chunks_start_then_as_read():
    """As a whole read orders them: by the chunk's start (its stored order), then as read."""
    columns = SeriesColumns({}, METRICS)
    nodes, metric_ids, gpus = (np.array([1, 1, 1]), np.array([5, 5, 5]), np.array([0, 0, 0]))
    chunk_starts = np.array([7.0, 4.0, 7.0])  # the second chunk began first
    columns.replace_spans({1: (0.0, 10.0)}, (nodes, metric_ids, gpus, chunk_starts,
                          np.array([8.0, 8.0, 8.0]), np.array([1.0, 2.0, 3.0])), 0.0)  # fmt: skip
    (series,) = columns.window(start=0.0, end=10.0, names=NAMES)
    assert series.values.tolist() == [2.0, 1.0, 3.0]
    columns.replace_spans({1: (0.0, 10.0)}, (nodes, metric_ids, gpus, chunk_starts,
                          np.array([8.0, 8.0, 8.0]), np.array([1.0, 2.0, 3.0])), 1.0)  # fmt: skip
    (series,) = columns.window(start=0.0, end=10.0, names=NAMES)
    assert series.values.tolist() == [3.0]  # thinned: the newest of the slot, as ordered


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.lists(times, max_size=8).map(sorted), min_size=1, max_size=6),
    x=st.integers(-2, 38).map(lambda half: half / 2),
)
def test_every_row_is_bisected_as_searchsorted_bisects_it(rows, x):
    """_left's one-look shortcuts (a row all below x, or none below) and its bisection of
    the rest give each row's own left insertion point; rows lie apart in one buffer."""
    buffer, lo, hi = [], [], []
    for row in rows:
        lo.append(len(buffer) + 1)
        buffer += [-99.0, *row, 99.0]  # points outside the rows, which must not be read
        hi.append(len(buffer) - 1)
    lo_, hi_ = np.array(lo), np.array(hi)
    got = _left(np.array(buffer), lo_, hi_, x)
    want = [
        a + int(np.searchsorted(np.array(row), x, side="left"))
        for a, row in zip(lo, rows, strict=True)
    ]
    assert got.tolist() == want
    assert lo_.tolist() == lo and hi_.tolist() == hi  # the caller's bounds stay as they were
