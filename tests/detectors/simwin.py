"""Turn the simulator's records into the detectors' window, as the alerts service would."""

from __future__ import annotations

from collections import defaultdict

from detectors.types import ClusterWindow, EventRow, NodeSeen, RunWindow, Series, StepRow
from opsboard_agent.sim.faults import fault_parse
from opsboard_agent.sim.layout import layout_build
from opsboard_agent.sim.model import ClusterModel, SimConfig, Tick

BASE_TS = 1_764_470_000.0


def play(
    *faults: str,
    duration: float = 300.0,
    nodes: int = 2,
    gpus: int = 8,
    tp: int = 1,
    seed: int = 0,
    interval: float = 10.0,
    **config: object,
) -> tuple[ClusterWindow, float]:
    """(window, now) after `duration` simulated seconds of a cluster with `faults`."""
    layout = layout_build(nodes=nodes, gpus=gpus, tp=tp)
    sim = SimConfig(seed=seed, interval=interval, **config)  # type: ignore[arg-type]
    model = ClusterModel(layout, [fault_parse(f, layout) for f in faults], sim)
    tick = model.advance(duration)
    return window_of(layout, tick, interval), BASE_TS + duration


def window_of(layout, tick: Tick, interval: float) -> ClusterWindow:
    steps: dict[str, list[StepRow]] = defaultdict(list)
    for s in tick.steps:
        f = s.fields
        canary = f.get("canary")
        steps[s.run].append(
            StepRow(
                node=s.node,
                rank=s.rank,
                step=f["step"],
                ts=BASE_TS + s.t,
                step_time=f["step_time"],
                data_time=f.get("data_time"),
                h2d_time=f.get("h2d_time"),
                compute_time=f.get("compute_time"),
                comm_wait=f.get("comm_wait"),
                tokens=f.get("tokens"),
                loss=f.get("loss"),
                grad_checksum=f.get("grad_checksum"),
                param_checksum=f.get("param_checksum"),
                canary_norm=canary["norm"] if canary else None,
                canary_proj=tuple(canary["proj"]) if canary else None,
                shard=f.get("shard"),
            )
        )
    run_events: dict[str, list[EventRow]] = defaultdict(list)
    node_events: list[EventRow] = []
    for e in tick.events:
        fields = dict(e.fields)
        row = EventRow(
            ts=BASE_TS + e.t,
            kind=fields.pop("kind"),
            node=e.node,
            run=e.run,
            step=fields.pop("step", None),
            rank=fields.pop("rank", None),
            gpu=fields.pop("gpu", None),
            data=fields,
        )
        (run_events[e.run] if e.run else node_events).append(row)
    points: dict[tuple[str, int | None, str], list[tuple[float, float]]] = defaultdict(list)
    last_seen: dict[str, float] = {}
    for sample in tick.samples:
        ts = BASE_TS + sample.t
        points[(sample.node, sample.gpu, sample.metric)].append((ts, sample.value))
        last_seen[sample.node] = max(last_seen.get(sample.node, ts), ts)
    for rows in steps.values():
        for row in rows:
            last_seen[row.node] = max(last_seen.get(row.node, row.ts), row.ts)
    runs = tuple(
        RunWindow(
            run=r.name,
            world_size=r.world_size,
            started_at=BASE_TS,
            steps=tuple(steps[r.name]),
            events=tuple(run_events[r.name]),
            rank_nodes={s.rank: s.node for s in r.ranks},
        )
        for r in layout.runs
    )
    return ClusterWindow(
        cluster="sim",
        runs=runs,
        telemetry=tuple(
            Series(node, metric, gpu, tuple(p)) for (node, gpu, metric), p in points.items()
        ),
        nodes=tuple(NodeSeen(n, last_seen.get(n), interval) for n in layout.nodes),
        events=tuple(node_events),
    )
