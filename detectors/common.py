"""Small pure helpers the detectors share: statistics, grouping, subjects, sustained runs."""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from detectors.types import ClusterWindow, EventRow, FloatColumn, RunWindow, Series, StepRow

T = TypeVar("T")

_RANK, _NODE, _STEP = attrgetter("rank"), attrgetter("node"), attrgetter("step")
_TIME = itemgetter(0)  # of a (ts, value) point
_STEP_TIME, _COMPUTE_TIME, _COMM_WAIT = (
    attrgetter("step_time"),
    attrgetter("compute_time"),
    attrgetter("comm_wait"),
)


def median(values: Iterable[float]) -> float:
    return statistics.median(values if isinstance(values, list) else list(values))


def rel_diff(a: float, b: float) -> float:
    """|a − b| relative to the larger magnitude (0 when both are 0)."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 1e-300 else 0.0


def pct(share: float) -> str:
    """0.314 → '31%'."""
    return f"{share * 100:.0f}%"


# Several detectors group the same run's rows (a 1,024-rank window holds ~60k) or index the
# same telemetry, so within one pass (`shared_results`: detect_all, goodput) each result is
# built once per (function, tuple). An entry holds the tuple itself, so its id cannot be
# reused while cached; results are shared and must not be changed. Nothing is kept past the
# pass: a module-level cache of the last 32 results kept the telemetry of the last few passes
# alive in the periodic worker (its RSS grew 78 % in a 3-minute soak, docs/faults.md, 10).
_MEMO: ContextVar[dict[tuple[str, int], tuple[object, object]] | None] = ContextVar(
    "detectors_memo", default=None
)


@contextmanager
def shared_results(kept: StepResults | None = None) -> Iterator[None]:
    """Share grouped and indexed results between the detectors for the duration of the
    block (one pass over one window); nested blocks share the outer one's. With `kept`, the
    per-step results (`per_step`) also carry over from the previous pass that used it."""
    if _MEMO.get() is not None:
        yield
        return
    token, kept_token = _MEMO.set({}), _KEPT.set(kept)
    try:
        yield
    finally:
        _MEMO.reset(token)
        _KEPT.reset(kept_token)
        if kept is not None:
            kept.end_pass()


class StepResults:
    """Per-step results kept from one pass to the next (see `per_step`). A window loader
    that keeps a run's unchanged steps hands the very same row lists to the next pass
    (`RunWindow.by_step`); a result is keyed by its list's identity and holds the list, so
    it is found again only for those rows, and a step whose rows changed (a new list) is
    computed afresh. What a pass did not ask for is dropped when it ends: the store holds
    about one window's worth. The results are those of pure functions of the rows: a pass
    with kept results finds what one without them would."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], tuple[object, object]] = {}
        self._used: dict[tuple[str, int], tuple[object, object]] = {}

    def get(self, name: str, rows: Sequence[StepRow], build: Callable[[], T]) -> T:
        key = (name, id(rows))
        hit = self._used.get(key) or self._entries.get(key)
        if hit is None or hit[0] is not rows:
            hit = (rows, build())
        self._used[key] = hit
        return hit[1]  # type: ignore[return-value]

    def end_pass(self) -> None:
        self._entries, self._used = self._used, {}

    def __len__(self) -> int:
        return len(self._entries)


_KEPT: ContextVar[StepResults | None] = ContextVar("detectors_kept", default=None)


def per_step(name: str, rows: Sequence[StepRow], build: Callable[[], T]) -> T:
    """`build()`, a pure function of one step's `rows` named `name` (with any parameter it
    reads in the name), kept between passes when the pass keeps results (`shared_results`);
    computed each time otherwise."""
    kept = _KEPT.get()
    return build() if kept is None else kept.get(name, rows, build)


def use_step_groups(window: ClusterWindow) -> None:
    """Within a pass, `by_step(run.steps)` answers with the groups the loader kept
    (`RunWindow.by_step`, the same grouping) rather than grouping the rows again."""
    memo = _MEMO.get()
    if memo is None:
        return
    for run in window.runs:
        if run.by_step is not None:
            memo[("by_step", id(run.steps))] = (run.steps, dict(run.by_step))
            nodes: dict[int, str] = {}
            last: dict[int, str] | None = None
            for rows in run.by_step.values():  # in step order: a rank's last row wins
                mapping = per_step("row_nodes", rows, partial(_rank_to_node, rows))
                # The ranks sit on the same nodes step after step: a mapping equal to the
                # one just applied changes nothing (16,384 ranks × 120 steps were 2 M
                # insertions a pass; a comparison is a tenth of that).
                if mapping is not last and mapping != last:
                    nodes.update(mapping)
                    last = mapping
            memo[("row_nodes", id(run.steps))] = (run.steps, nodes)


def _rank_to_node(rows: Sequence[StepRow]) -> dict[int, str]:
    return dict(zip(map(_RANK, rows), map(_NODE, rows), strict=True))


def _memo(name: str, key: tuple[object, ...], build: Callable[[], T]) -> T:
    memo = _MEMO.get()
    if memo is None:  # outside a pass: nothing to share with
        return build()
    hit = memo.get((name, id(key)))
    if hit is not None and hit[0] is key:
        return hit[1]  # type: ignore[return-value]
    value = build()
    memo[(name, id(key))] = (key, value)
    return value


def by_step(steps: Iterable[StepRow]) -> dict[int, list[StepRow]]:
    """Rows grouped by step number, in the window's order. Do not change the result: for a
    tuple it may be shared."""

    def build() -> dict[int, list[StepRow]]:
        # a window comes ordered by step: one run of rows a step, grouped in C (a loop body
        # per row was 30 k appends a pass); rows out of order are grouped one by one
        rows = steps if isinstance(steps, tuple | list) else list(steps)
        runs = [(number, list(group)) for number, group in groupby(rows, _STEP)]
        grouped = dict(runs)
        if len(grouped) == len(runs):
            return grouped
        out: dict[int, list[StepRow]] = defaultdict(list)
        for row in rows:
            out[row.step].append(row)
        return dict(out)

    return _memo("by_step", steps, build) if isinstance(steps, tuple) else build()


def _median_step_time(rows: Sequence[StepRow]) -> float:
    return median(list(map(_STEP_TIME, rows)))


def step_times(steps: tuple[StepRow, ...]) -> dict[int, float]:
    """step → the median step_time of its rows (see `by_step`; shared: do not change)."""

    def build() -> dict[int, float]:
        return {
            n: per_step("step_time", rows, partial(_median_step_time, rows))
            for n, rows in by_step(steps).items()
        }

    return _memo("step_times", steps, build)


def computes_of(rows: Sequence[StepRow]) -> list[float | None]:
    """`compute_of` of each row, in order; when every row reports compute_time (the usual
    case) without a Python call per row."""
    values: list[float | None] = list(map(_COMPUTE_TIME, rows))
    return values if None not in values else [compute_of(row) for row in rows]


def comms_of(rows: Sequence[StepRow]) -> list[float | None]:
    """`comm_of` of each row, in order (as `computes_of`)."""
    values: list[float | None] = list(map(_COMM_WAIT, rows))
    return values if None not in values else [comm_of(row) for row in rows]


def compute_of(row: StepRow) -> float | None:
    """The rank's own work in a step: compute_time, else step_time − comm_wait (what is
    left once the time blocked in collectives is taken out)."""
    if row.compute_time is not None:
        return row.compute_time
    if row.comm_wait is not None:
        return row.step_time - row.comm_wait
    return None


def comm_of(row: StepRow) -> float | None:
    """Time blocked in collectives: comm_wait, else what the other parts leave of the step."""
    if row.comm_wait is not None:
        return row.comm_wait
    parts = (row.data_time, row.h2d_time, row.compute_time)
    if all(p is not None for p in parts):
        return row.step_time - sum(p for p in parts if p is not None)
    return None


def row_nodes(steps: tuple[StepRow, ...]) -> dict[int, str]:
    """rank → node as the rows say (a rank's last row wins), for every rank with a row. Do
    not change the result: it is shared."""

    return _memo("row_nodes", steps, partial(_rank_to_node, steps))


def rank_nodes(run: RunWindow) -> dict[int, str]:
    """rank → node: the window's map, completed from the step rows (a fresh dict)."""
    return {**row_nodes(run.steps), **run.rank_nodes}


def node_runs(window: ClusterWindow) -> dict[str, str]:
    """node → the run it serves (the last run in the window that names it). Do not change
    the result: it is shared."""

    def build() -> dict[str, str]:
        out: dict[str, str] = {}
        for run in window.runs:
            for node in set(rank_nodes(run).values()):
                out[node] = run.run
        return out

    return _memo("node_runs", window.runs, build)


def series_index(window: ClusterWindow) -> dict[tuple[str, int | None, str], Series]:
    """(node, gpu, metric) → its series. Do not change the result: it is shared."""
    telemetry = window.telemetry
    return _memo(
        "series_index", telemetry, lambda: {(s.node, s.gpu, s.metric): s for s in telemetry}
    )


def trailing_since(
    points: Sequence[tuple[float, float]], condition: Callable[[float], bool]
) -> float | None:
    """The time of the first point of the newest unbroken run of points that meet
    `condition`; None when the newest point does not."""
    since = None
    for ts, value in reversed(points):
        if not condition(value):
            break
        since = ts
    return since


def sustained(
    points: Sequence[tuple[float, float]],
    condition: Callable[[float], object],
    span: float,
    share: float,
) -> float | None:
    """When a condition that must hold "for `span` seconds" began, or None when it does not
    hold now. It holds when the series reaches back `span` seconds from its newest point and
    at least `share` of the samples of those seconds meet it: one stray sample (jitter, a
    dropped reading) neither makes nor breaks it, where requiring every sample would. The
    start is the first meeting sample of the longest trailing stretch that keeps `share`."""
    if not points or points[-1][0] - points[0][0] < span:
        return None
    end = points[-1][0]
    start = bisect_left(points, end - span, key=_TIME)
    recent = points[start:]
    if sum(1 for _, v in recent if condition(v)) < share * len(recent):
        return None
    since, met = None, 0
    for seen, (ts, value) in enumerate(reversed(points), start=1):
        if condition(value):
            met += 1
            if met >= share * seen:
                since = ts
    return since


def sustained_met(
    times: FloatColumn, met: NDArray[np.bool_], span: float, share: float
) -> float | None:
    """`sustained` over a series' columns: `met` says which of its samples meet the
    condition (a vectorised comparison of its values). The same answer, in numpy: a series
    of 600 points costs a few array operations rather than a Python call per point."""
    return sustained_where(times, met, _itself, span, share)


def sustained_where(
    times: FloatColumn,
    values: NDArray[Any],
    met_of: Callable[[NDArray[Any]], NDArray[np.bool_]],
    span: float,
    share: float,
) -> float | None:
    """`sustained_met` with the condition given as `met_of(values)`, judged first on the
    samples of the last `span` only: a healthy GPU's series (nearly all of them, every
    pass) costs a comparison of those, not of its whole window."""
    n = len(times)
    if not n or times[-1] - times[0] < span:
        return None
    start = int(np.searchsorted(times, times[-1] - span, side="left"))
    if np.count_nonzero(met_of(values[start:])) < share * (n - start):
        return None
    newest_first = met_of(values)[::-1]
    # the newest `seen` samples keep the share where the running count of met ones does
    seen = np.arange(1, n + 1)
    kept = newest_first & (np.cumsum(newest_first) >= share * seen)
    hits = np.flatnonzero(kept)
    return times[n - 1 - hits[-1]].item() if hits.size else None


def sustained_tails(
    series: Sequence[Series],
    met_of: Callable[[NDArray[Any]], NDArray[np.bool_]],
    span: float,
    share: float,
) -> list[bool]:
    """For each series, whether `sustained_where` over it passes its first test (the series
    reaches back `span` and the samples of its last `span` keep `share`): where this says
    False, sustained_where says None. One `met_of` over every series' tail at once, so that
    a detector walks only the GPUs that may raise something: at 16,384 GPUs, a call per
    series (≈ 25 µs) was most of thermal's pass."""
    passed = [False] * len(series)
    long_enough = [
        i for i, s in enumerate(series) if len(s.times) and s.times[-1] - s.times[0] >= span
    ]
    if not long_enough:
        return passed
    starts = [
        int(series[i].times.searchsorted(series[i].times[-1] - span, side="left"))
        for i in long_enough
    ]
    tails = [series[i].values[start:] for i, start in zip(long_enough, starts, strict=True)]
    lengths = np.fromiter(map(len, tails), dtype=np.int64, count=len(tails))
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    met = np.add.reduceat(met_of(np.concatenate(tails)).astype(np.int64), offsets)
    for i, count, length in zip(long_enough, met.tolist(), lengths.tolist(), strict=True):
        passed[i] = count >= share * length
    return passed


def over(values: FloatColumn, limit: float) -> NDArray[np.bool_]:
    """Which values are over `limit` (a `met_of` for sustained_where, with partial)."""
    return values > limit


def at_least(values: FloatColumn, limit: float) -> NDArray[np.bool_]:
    return values >= limit


def under(values: FloatColumn, limit: float) -> NDArray[np.bool_]:
    return values < limit


def _itself(met: NDArray[np.bool_]) -> NDArray[np.bool_]:
    return met


def mask_bits(values: FloatColumn, bits: int) -> NDArray[np.bool_]:
    """Which samples of a bitmask series (NVML throttle reasons) have any of `bits` set, as
    `int(value) & bits` says of each."""
    if values.size and np.isfinite(values).all() and np.abs(values).max() < 2.0**62:
        return (np.trunc(values).astype(np.int64) & bits) != 0
    # what numpy cannot hold as int64 (or int() refuses, as it did before) goes one by one
    return np.array([bool(int(v) & bits) for v in values.tolist()], dtype=bool)


def unique_events(window: ClusterWindow, kind: str) -> list[tuple[str | None, EventRow]]:
    """(run, event) for the events of `kind` from the cluster and its runs, each once (a run
    event may also be in the cluster's list), oldest first; run from the event or its run."""
    seen: dict[tuple[float, str, int | None, int | None], int] = {}
    out: list[tuple[str | None, EventRow]] = []
    every = [(e.run, e) for e in window.events]
    every += [(e.run or run.run, e) for run in window.runs for e in run.events]
    for run, event in sorted(every, key=lambda pair: pair[1].ts):
        if event.kind != kind:
            continue
        key = (event.ts, event.node, event.rank, event.gpu)
        if key in seen:
            index = seen[key]
            if out[index][0] is None:
                out[index] = (run, event)
            continue
        seen[key] = len(out)
        out.append((run, event))
    return out


def run_subject(run: str, rank: int | None = None, node: str | None = None) -> str:
    if rank is not None:
        return f"run:{run}/rank:{rank}"
    if node is not None:
        return f"run:{run}/node:{node}"
    return f"run:{run}"


def node_subject(node: str, gpu: int | None = None) -> str:
    return f"node:{node}" if gpu is None else f"node:{node}/gpu:{gpu}"
