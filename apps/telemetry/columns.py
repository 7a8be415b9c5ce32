"""A drain's samples as columns sorted into series, the form the worker stores them from.

Grouping samples into per-series lists of (ts, value) tuples, sorted one list at a time, cost
the ingest worker ≈ 0.25 ms of CPU per 1,000-sample batch, and building the COPY rows from
those tuples as much again. Here the samples of every batch of a drain are two float64
columns (times, values) and a series code per sample, sorted once by (series, ts, value):
each series is then a slice of the columns, in the order the tuples were sorted before, so
every row, range and latest value stored is what the tuples gave.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import msgspec
import numpy as np

from apps.telemetry.models import HOST_GPU

Key = tuple[int, str, int]  # (node id, metric name, gpu; HOST_GPU for host series)


class SampleColumns(NamedTuple):
    """Samples grouped into series: series i is `times[bounds[i]:bounds[i + 1]]` (and the
    same slice of `values`), sorted by (ts, value); `keys` in the order each series was
    first seen; `latest[i]` the (ts, value) of series i's last point as sent (an int stays
    an int: latest health stores what the agent sent)."""

    keys: list[Key]
    bounds: np.ndarray  # int64, len(keys) + 1
    times: np.ndarray  # float64, Unix seconds
    values: np.ndarray  # float64
    latest: list[tuple[Any, Any]]

    @property
    def count(self) -> int:
        return len(self.times)

    def points(self, index: int) -> list[tuple[float, float]]:
        """Series `index`'s points as (ts, value) floats, in time order."""
        start, end = int(self.bounds[index]), int(self.bounds[index + 1])
        return list(
            zip(self.times[start:end].tolist(), self.values[start:end].tolist(), strict=True)
        )


class Sample(msgspec.Struct, gc=False):
    """A stored sample as the worker decodes it (apps.ingest.services.stored): its numbers as
    sent, int or float."""

    ts: int | float
    metric: str
    value: int | float
    gpu: int | None = None


def columns_from_records(parts: Iterable[tuple[int, Sequence[Sample]]]) -> SampleColumns:
    """The samples of (node id, samples) parts."""
    index: dict[Key, int] = {}
    codes: list[int] = []
    times: list[Any] = []
    values: list[Any] = []
    for node_id, samples in parts:
        codes += [
            index.setdefault((node_id, s.metric, HOST_GPU if s.gpu is None else s.gpu), len(index))
            for s in samples
        ]
        times += [s.ts for s in samples]
        values += [s.value for s in samples]
    return _sorted(index, codes, times, values)


def columns_from_dicts(parts: Iterable[tuple[int, Sequence[dict[str, Any]]]]) -> SampleColumns:
    """The same from samples as dicts (the contract's JSON objects)."""
    return columns_from_records(
        (node_id, msgspec.convert(samples, list[Sample])) for node_id, samples in parts
    )


def _sorted(index: dict[Key, int], codes: list[int], times: list, values: list) -> SampleColumns:
    code = np.array(codes, dtype=np.int64)
    ts = np.array(times, dtype=np.float64)
    vals = np.array(values, dtype=np.float64)
    order = np.argsort(code, kind="stable")
    by_series = code[order], ts[order], vals[order]
    if not _series_in_order(*by_series):
        # as tuples sort: by (series, ts, value); stable, so equal points keep the sent order
        order = np.lexsort((vals, ts, code))
        by_series = code[order], ts[order], vals[order]
    code, ts, vals = by_series
    bounds = np.searchsorted(code, np.arange(len(index) + 1))
    last = order[bounds[1:] - 1].tolist() if len(index) else []
    return SampleColumns(list(index), bounds, ts, vals, [(times[at], values[at]) for at in last])


def _series_in_order(code: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> bool:
    """Whether, within each series, the points already stand in (ts, value) order (agents
    send them so: then one stable sort by series is the whole sort)."""
    same = code[1:] == code[:-1]
    back = (ts[1:] < ts[:-1]) | ((ts[1:] == ts[:-1]) & (vals[1:] < vals[:-1]))
    return not bool(np.any(same & back))
