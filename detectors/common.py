"""Small pure helpers the detectors share: statistics, grouping, subjects, sustained runs."""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from detectors.types import ClusterWindow, EventRow, RunWindow, Series, StepRow

T = TypeVar("T")


def median(values: Iterable[float]) -> float:
    return statistics.median(values if isinstance(values, list) else list(values))


def rel_diff(a: float, b: float) -> float:
    """|a − b| relative to the larger magnitude (0 when both are 0)."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 1e-300 else 0.0


def pct(share: float) -> str:
    """0.314 → '31%'."""
    return f"{share * 100:.0f}%"


# Several detectors group the same run's rows (a 1,024-rank window holds ~60k), so the
# few most recent results are kept per (function, tuple). An entry holds the tuple itself,
# so its id cannot be reused while cached; results are shared and must not be changed.
_MEMO: dict[tuple[str, int], tuple[object, object]] = {}
_MEMO_SIZE = 16


def _memo(name: str, key: tuple[StepRow, ...], build: Callable[[], T]) -> T:
    hit = _MEMO.get((name, id(key)))
    if hit is not None and hit[0] is key:
        return hit[1]  # type: ignore[return-value]
    value = build()
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[(name, id(key))] = (key, value)
    return value


def by_step(steps: Iterable[StepRow]) -> dict[int, list[StepRow]]:
    """Rows grouped by step number, in the window's order. Do not change the result: for a
    tuple it may be shared."""

    def build() -> dict[int, list[StepRow]]:
        out: dict[int, list[StepRow]] = defaultdict(list)
        for row in steps:
            out[row.step].append(row)
        return dict(out)

    return _memo("by_step", steps, build) if isinstance(steps, tuple) else build()


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


def rank_nodes(run: RunWindow) -> dict[int, str]:
    """rank → node: the window's map, completed from the step rows (a fresh dict)."""

    def from_rows() -> dict[int, str]:
        return {row.rank: row.node for row in run.steps}

    return {**_memo("rank_nodes", run.steps, from_rows), **run.rank_nodes}


def node_runs(window: ClusterWindow) -> dict[str, str]:
    """node → the run it serves (the last run in the window that names it)."""
    out: dict[str, str] = {}
    for run in window.runs:
        for node in set(rank_nodes(run).values()):
            out[node] = run.run
    return out


def series_index(window: ClusterWindow) -> dict[tuple[str, int | None, str], Series]:
    """(node, gpu, metric) → its series."""
    return {(s.node, s.gpu, s.metric): s for s in window.telemetry}


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
    start = bisect_left(points, end - span, key=lambda p: p[0])
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
