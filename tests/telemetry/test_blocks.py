"""SeriesBlocks: many series' points from chunk rows a block at a time are what one pass over
every point gives, whatever the block size (series split across blocks included)."""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from apps.alerts.selectors.kept_columns import SeriesColumns
from apps.telemetry.blocks import SeriesBlocks, SpanPoints

START, END = 1_000.0, 1_060.0


def reference(rows, *, resolution: float) -> dict:
    """Every series' points in [START, END): the rows' order, stable-sorted by time, then
    chunk start (stored rows come by chunk start already), then the newest point of each
    slot."""
    points: dict = {}
    for node, metric, gpu, e0, offsets, vals, _, _ in rows:
        for offset, value in zip(offsets.tolist(), vals.tolist(), strict=True):
            ts = e0 + offset / 1000.0
            if START <= ts < END:
                points.setdefault((node, metric, gpu), []).append((ts, e0, value))
    out = {}
    for key, triples in points.items():
        triples.sort(key=lambda point: point[:2])  # stable
        series = [(ts, value) for ts, _, value in triples]
        if resolution > 0:
            slot = {math.floor((ts - START) / resolution): (ts, v) for ts, v in series}
            series = [slot[k] for k in sorted(slot)]
        out[key] = series
    return out


e0s = st.floats(min_value=990.0, max_value=1_070.0, allow_nan=False)
chunk = st.one_of(
    st.tuples(e0s, st.lists(st.integers(min_value=0, max_value=9_000), max_size=12)),
    st.tuples(e0s, st.just([0])),  # a one-point chunk as ingest writes it: its point at t0
)
series_chunks = st.lists(chunk, min_size=1, max_size=5)


@st.composite
def chunk_rows(draw):
    rows = []
    for index, chunks in enumerate(draw(st.lists(series_chunks, min_size=1, max_size=6))):
        key = (index // 3, 7, index % 3 - 1)  # (node, metric, gpu), in key order
        for e0, offsets in sorted(chunks, key=lambda c: c[0]):  # stored by t0
            vals = np.arange(len(offsets), dtype=np.float64) + 100 * index
            rows.append((*key, e0, np.array(offsets, dtype=np.int64), vals, None, None))
    return rows


@settings(max_examples=200, deadline=None)
@given(
    rows=chunk_rows(),
    block=st.integers(min_value=1, max_value=8),
    resolution=st.sampled_from([0.0, 1.0, 2.5]),
)
def test_blocks_give_what_one_pass_over_every_point_gives(rows, block, resolution):
    blocks = SeriesBlocks(start=START, end=END, resolution=resolution)
    for first in range(0, len(rows), block):
        blocks.add(rows[first : first + block])
    assert blocks.series() == reference(rows, resolution=resolution)


def test_a_dense_series_stays_bounded_as_blocks_come():
    # 600 one-point-per-100-ms chunks of one series in 1-row blocks: what is held is merged
    # and thinned whenever it passes twice the slots, so it never holds all 6,000 points
    blocks = SeriesBlocks(start=START, end=END, resolution=1.0)
    most = 0
    for i in range(600):
        offsets = np.arange(10, dtype=np.int64) * 10
        e0 = START + i / 10
        blocks.add([(1, 1, 0, e0, offsets, np.full(10, float(i)), None, None)])
        most = max(most, blocks.held[(1, 1, 0)])
    assert most <= 2 * 60 + 10
    [(key, points)] = blocks.series().items()
    assert len(points) == 60 and points[-1][1] == 599.0


def one_point(row) -> bool:
    """A chunk the spans read sends as a one-point raw chunk: its point at its start."""
    return len(row[4]) == 1 and row[4][0] == 0


def read_order(rows) -> list:
    """Chunk rows in the order the spans read sends their points (_SPANS_SQL): a node's
    one-point chunks, then its other chunks, each in stored order."""
    return sorted(rows, key=lambda row: (row[0], not one_point(row)))


def as_node_rows(rows) -> list:
    """The same points as the spans read sends them (apps.telemetry.selectors, _SPANS_SQL):
    a row per node of its one-point chunks, every point with its series and chunk start and
    without offsets, then a row of its other chunks: each chunk's series, start and count,
    and their arrays as array_send joins them."""
    by_node: dict = {}
    for node, metric, gpu, e0, offsets, vals, _, _ in rows:
        kind = one_point((node, metric, gpu, e0, offsets))
        by_node.setdefault((node, not kind), []).append((metric, gpu, e0, offsets, vals))
    out = []
    for (node, other), chunks in sorted(by_node.items()):
        series = np.array([(c[0] << 16) | (c[1] + 32768) for c in chunks], dtype=np.int64)
        starts = np.array([c[2] for c in chunks])
        if not other:
            values = np.concatenate([c[4] for c in chunks])
            out.append((node, series, starts, None, values, None, None, None, None, None))
            continue
        counts = np.array([len(c[3]) for c in chunks])
        offsets = b"".join(array_send(c[3], 23, ">i4") for c in chunks)
        values = b"".join(array_send(c[4], 701, ">f8") for c in chunks)
        out.append((node, series, starts, None, None, None, None, counts, offsets, values))
    return out


def array_send(items, oid: int, element: str) -> bytes:
    """Postgres's binary form of a one-dimensional array without NULLs (array_send)."""
    pairs = np.empty(len(items), dtype=[("length", ">i4"), ("value", element)])
    pairs["length"], pairs["value"] = np.dtype(element).itemsize, items
    if not len(items):  # no dimension, as Postgres sends an empty array
        return struct.pack("!iii", 0, 0, oid)
    return struct.pack("!iiiii", 1, 0, oid, len(items), 1) + pairs.tobytes()


@settings(max_examples=200, deadline=None)
@given(
    rows=chunk_rows(),
    block=st.integers(min_value=1, max_value=3),
    resolution=st.sampled_from([0.0, 1.0]),
    metric=st.sampled_from([7, 70_000, 2**31 - 1]),  # ids past 16 bits too
)
@example(  # two nodes' rows of many-point chunks in one block: their points split apart
    rows=[
        (0, 7, 0, 1000.0, np.array([0, 1000, 2000]), np.array([1.0, 2.0, 3.0]), None, None),
        (0, 7, 0, 1010.0, np.array([0, 500]), np.array([4.0, 5.0]), None, None),
        (1, 7, 1, 1001.0, np.array([0, 1000]), np.array([6.0, 7.0]), None, None),
    ],
    block=3,
    resolution=0.0,
    metric=7,
)
def test_a_row_per_node_gives_what_a_row_per_chunk_gives(rows, block, resolution, metric):
    """The spans read's node rows (SpanPoints), placed in a kept window's columns, hold the
    points a row per chunk holds."""
    rows = [(node, metric, *rest) for node, _, *rest in rows]
    node_rows = as_node_rows(rows)
    points = SpanPoints()
    for first in range(0, len(node_rows), block):
        points.add(node_rows[first : first + block])
    nodes = {row[0] for row in rows}
    columns = SeriesColumns({}, {metric: "m"})
    columns.replace_spans({node: (START, END) for node in nodes}, points.columns(), resolution)
    names = {node: f"n{node}" for node in nodes}
    kept = {
        (int(s.node[1:]), metric, -1 if s.gpu is None else s.gpu): list(
            zip(s.times.tolist(), s.values.tolist(), strict=True)
        )
        for s in columns.window(start=START, end=END, names=names)
    }
    assert kept == reference(read_order(rows), resolution=resolution)
