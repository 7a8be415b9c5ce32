"""Small pure helpers the detectors share: statistics, grouping, subjects. Conditions held
over a span of a series are in detectors.sustained."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from itertools import groupby
from operator import attrgetter
from typing import TypeVar

from detectors.types import ClusterWindow, EventRow, RunWindow, Series, StepRow

T = TypeVar("T")

_RANK, _NODE, _STEP = attrgetter("rank"), attrgetter("node"), attrgetter("step")
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
                # one before changes nothing (16,384 ranks × 120 steps were 2 M insertions
                # a pass), and whether it is equal is kept with the step, so a pass compares
                # only its new steps' (120 comparisons of 16,384 ranks were 30 ms a pass).
                if last is None or not _same_as_before(rows, mapping, last):
                    nodes.update(mapping)
                last = mapping
            memo[("row_nodes", id(run.steps))] = (run.steps, nodes)


def _same_as_before(
    rows: Sequence[StepRow], mapping: dict[int, str], before: dict[int, str]
) -> bool:
    """Whether a step's rank map equals the step before's, kept with the step (per_step)
    while the step before's map is the same object."""
    if mapping is before:
        return True
    seen, same = per_step(f"row_nodes_same:{id(before)}", rows,
                          lambda: (before, mapping == before))  # fmt: skip
    return same if seen is before else mapping == before


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
