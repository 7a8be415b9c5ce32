"""Hand-built windows: a synchronous data-parallel run shaped like the simulator's."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from detectors.types import ClusterWindow, EventRow, NodeSeen, RunWindow, Series, StepRow

T0 = 1_764_000_000.0
RUN = "r"


def node_of(rank: int, gpus: int = 8) -> str:
    return f"n{rank // gpus}"


def steps(
    *,
    ranks: int = 16,
    count: int = 40,
    gpus: int = 8,
    first: int = 0,
    start: float = T0,
    compute: Callable[[int, int], float] = lambda rank, step: 0.80,
    data: Callable[[int, int], float] = lambda rank, step: 0.03,
    h2d: Callable[[int, int], float] = lambda rank, step: 0.01,
    comm: Callable[[int], float] = lambda step: 0.14,
    rank_of: Callable[[int], int] = lambda rank: rank,
    extra: Callable[[int, int], dict] = lambda rank, step: {},
) -> tuple[StepRow, ...]:
    """`count` steps of `ranks` ranks: step_time = slowest ready + comm, and each rank's
    comm_wait is the rest of its step (so the slow rank waits least)."""
    rows = []
    t = start
    for step in range(first, first + count):
        ready = {r: (data(r, step), h2d(r, step), compute(r, step)) for r in range(ranks)}
        step_time = max(sum(v) for v in ready.values()) + comm(step)
        t += step_time
        for r, (d, h, c) in ready.items():
            rows.append(
                StepRow(
                    node=node_of(r, gpus),
                    rank=rank_of(r),
                    step=step,
                    ts=t,
                    step_time=step_time,
                    data_time=d,
                    h2d_time=h,
                    compute_time=c,
                    comm_wait=step_time - d - h - c,
                    **extra(r, step),
                )
            )
    return tuple(rows)


def run(
    rows: Iterable[StepRow] = (),
    events: Iterable[EventRow] = (),
    *,
    world: int | None = None,
    started_at: float | None = T0,
    name: str = RUN,
) -> RunWindow:
    rows = tuple(rows)
    nodes = {r.rank: r.node for r in rows}
    return RunWindow(
        run=name,
        world_size=world if world is not None else len(nodes),
        started_at=started_at,
        steps=rows,
        events=tuple(events),
        rank_nodes=nodes,
    )


def cluster(
    *runs: RunWindow,
    telemetry: Iterable[Series] = (),
    nodes: Iterable[NodeSeen] = (),
    events: Iterable[EventRow] = (),
) -> ClusterWindow:
    return ClusterWindow("c", tuple(runs), tuple(telemetry), tuple(nodes), tuple(events))


def series(
    node: str, metric: str, values: Iterable[float], *, gpu: int | None = 0, every: float = 10.0
) -> Series:
    """Points every `every` seconds from T0."""
    return Series(node, metric, gpu, tuple((T0 + i * every, v) for i, v in enumerate(values)))


def last_ts(rows: Iterable[StepRow]) -> float:
    return max(r.ts for r in rows)
