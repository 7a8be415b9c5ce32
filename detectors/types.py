"""What detectors see and what they say: plain frozen dataclasses, no Django.

A service (apps/alerts) loads a window of recent data through selectors into these types,
calls the detectors with `now`, and keeps the findings as alerts. Detectors are pure: the
same window and `now` always give the same findings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeAlias, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

Severity = Literal["warning", "critical"]
FloatColumn: TypeAlias = NDArray[np.float64]


class StepRow(NamedTuple):
    """One rank's report of one training step (the contract's `steps` record).

    A named tuple, not a frozen dataclass like the rest: a window holds one per rank and
    step (33 k for 256 ranks), and a dataclass's __init__ (one object.__setattr__ a field)
    cost a cluster's pass 70 ms of its 150 ms budget where a tuple costs 8 ms. It is as
    immutable, reads the same (`row.step_time`), and `row._replace(...)` copies it."""

    node: str
    rank: int
    step: int
    ts: float
    step_time: float
    data_time: float | None = None
    h2d_time: float | None = None
    compute_time: float | None = None
    comm_wait: float | None = None
    tokens: int | None = None
    loss: float | None = None
    grad_checksum: str | None = None
    param_checksum: str | None = None
    canary_norm: float | None = None
    canary_proj: tuple[float, ...] | None = None
    shard: str | None = None
    gpu: int | None = None  # the rank's GPU index on its node, when the report named it


@dataclass(frozen=True)
class EventRow:
    """An agent event: checkpoint, restart, oom, xid, ecc, error, log."""

    ts: float
    kind: str
    node: str
    run: str | None = None
    step: int | None = None
    rank: int | None = None
    gpu: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)  # tier, state, code, count, ...


class Series:
    """Points of one telemetry series, oldest first; gpu None for host-wide metrics.

    Held as two columns, `times` and `values` (read-only float64 arrays of one length), so
    that a window kept between passes appends and trims a series in numpy rather than
    rebuilding a tuple of (ts, value) tuples, and detectors read a series with vectorised
    numpy (a 1,024-rank window holds 2.5 M points). `points` is the same data as (ts,
    value) tuples, for detectors that walk it in Python. Built from `points` (a sequence of
    pairs) or from `times` and `values`. Immutable, and equal when node, metric, gpu and
    every point are."""

    __slots__ = ("node", "metric", "gpu", "times", "values")

    node: str
    metric: str
    gpu: int | None
    times: FloatColumn
    values: FloatColumn

    def __init__(
        self,
        node: str,
        metric: str,
        gpu: int | None,
        points: Sequence[tuple[float, float]] = (),
        *,
        times: ArrayLike | None = None,
        values: ArrayLike | None = None,
    ) -> None:
        if times is None or values is None:
            pairs = np.asarray(points, dtype=np.float64).reshape(-1, 2)
            times, values = pairs[:, 0], pairs[:, 1]
        times, values = _column(times), _column(values)
        if len(times) != len(values):
            raise ValueError("a series' times and values differ in length")
        setter = object.__setattr__
        setter(self, "node", node)
        setter(self, "metric", metric)
        setter(self, "gpu", gpu)
        setter(self, "times", times)
        setter(self, "values", values)

    @classmethod
    def of_columns(
        cls, node: str, metric: str, gpu: int | None, times: FloatColumn, values: FloatColumn
    ) -> Series:
        """A Series of columns the caller vouches for: one-dimensional, float64, read-only,
        of one length (a kept window's slices of its read-only views). It skips the checks
        and views of the constructor, which a pass over 65,536 series pays for each."""
        # the slots' own setters: object.__setattr__ looks each name up (half the cost)
        series = object.__new__(cls)
        _SET_NODE(series, node)
        _SET_METRIC(series, metric)
        _SET_GPU(series, gpu)
        _SET_TIMES(series, times)
        _SET_VALUES(series, values)
        return series

    @property
    def points(self) -> Points:
        """The (ts, value) pairs as Python floats: a sequence over the columns, which builds
        no tuple until one is read."""
        return Points(self.times, self.values)

    def __len__(self) -> int:
        return len(self.times)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Series is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Series is immutable: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Series):
            return NotImplemented
        return (
            (self.node, self.metric, self.gpu) == (other.node, other.metric, other.gpu)
            and np.array_equal(self.times, other.times)
            and np.array_equal(self.values, other.values)
        )

    def __hash__(self) -> int:
        return hash((self.node, self.metric, self.gpu, len(self.times)))

    def __repr__(self) -> str:
        return (
            f"Series(node={self.node!r}, metric={self.metric!r}, gpu={self.gpu!r}, "
            f"points={len(self.times)})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_series, (self.node, self.metric, self.gpu, self.times, self.values))


_SET_NODE, _SET_METRIC, _SET_GPU, _SET_TIMES, _SET_VALUES = (
    getattr(Series, name).__set__ for name in ("node", "metric", "gpu", "times", "values")
)


def _series(
    node: str, metric: str, gpu: int | None, times: FloatColumn, values: FloatColumn
) -> Series:
    return Series(node, metric, gpu, times=times, values=values)


def _column(data: ArrayLike) -> FloatColumn:
    """`data` as a one-dimensional read-only float64 array: a read-only view when it is an
    array already (kept windows hand on slices of what they hold), else a copy."""
    if type(data) is np.ndarray and data.dtype is _FLOAT64 and data.ndim == 1:
        column = data  # the common case, as kept windows and reads hand columns on
    else:
        column = np.asarray(data, dtype=np.float64)
        if column.ndim != 1:
            raise ValueError("a series' column is one-dimensional")
    if column.flags.writeable:
        column = column.view()
        column.flags.writeable = False
    return column


_FLOAT64 = np.dtype(np.float64)


class Points(Sequence[tuple[float, float]]):
    """A series' points as (ts, value) pairs of Python floats, over its columns: its length,
    an item or the newest few cost the same whatever the series holds; iterating builds the
    pairs as it goes. Compares equal to any sequence of the same pairs (a tuple of them)."""

    __slots__ = ("_times", "_values")

    def __init__(self, times: FloatColumn, values: FloatColumn) -> None:
        self._times, self._values = times, values

    def __len__(self) -> int:
        return len(self._times)

    @overload
    def __getitem__(self, index: int) -> tuple[float, float]: ...

    @overload
    def __getitem__(self, index: slice) -> Points: ...

    def __getitem__(self, index: int | slice) -> tuple[float, float] | Points:
        if isinstance(index, slice):
            return Points(self._times[index], self._values[index])
        return (self._times[index].item(), self._values[index].item())

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self._times.tolist(), self._values.tolist(), strict=True)

    def __reversed__(self) -> Iterator[tuple[float, float]]:
        return zip(self._times[::-1].tolist(), self._values[::-1].tolist(), strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Points):
            return np.array_equal(self._times, other._times) and np.array_equal(
                self._values, other._values
            )
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a list: equal to tuples, so unhashable

    def __repr__(self) -> str:
        return f"Points({tuple(self)!r})"


@dataclass(frozen=True)
class NodeSeen:
    """When the server last heard from a node, and its usual gap between batches."""

    node: str
    last_seen: float | None
    batch_interval: float | None  # median seconds between its recent batches
    state: str = "active"  # active | cordoned | draining | down


@dataclass(frozen=True)
class RunWindow:
    """A run's recent step reports (all ranks, oldest first) and events."""

    run: str
    world_size: int
    started_at: float | None
    steps: tuple[StepRow, ...]
    events: tuple[EventRow, ...]
    rank_nodes: Mapping[int, str] = field(default_factory=dict)  # rank → node
    # `steps` grouped by step number (what common.by_step would build), when the loader
    # keeps them between passes: an unchanged step is the same list from pass to pass, so
    # its per-step results carry over (common.StepResults). Never changed once handed over.
    by_step: Mapping[int, list[StepRow]] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ClusterWindow:
    """Everything the detectors of one cluster look at, at one moment."""

    cluster: str
    runs: tuple[RunWindow, ...]
    telemetry: tuple[Series, ...]
    nodes: tuple[NodeSeen, ...]
    events: tuple[EventRow, ...]  # node events (xid, ecc, oom, ...) in the window


@dataclass(frozen=True)
class Finding:
    """A condition a detector sees now. `subject` is stable while the condition lasts (it
    keys the alert: one open alert per (kind, subject)); `evidence` is plain JSON."""

    kind: str  # straggler, sdc, input_bound, hang, checkpoint_stale, checkpoint_upload,
    # oom_risk, oom, thermal, power, xid, ecc, heartbeat, fabric
    subject: str  # e.g. "run:llama/rank:13", "node:node-02/gpu:3", "node:node-05"
    severity: Severity
    summary: str  # one sentence naming the culprit, e.g. "rank 13 on node-02 computes 31% …"
    run: str | None = None
    node: str | None = None
    rank: int | None = None
    gpu: int | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    since: float | None = None  # when the condition began, as far as the window shows
