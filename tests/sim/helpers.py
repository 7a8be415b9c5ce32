"""Helpers for the simulator's tests: build and play a model without any server."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from opsboard_agent.sim.faults import fault_parse
from opsboard_agent.sim.layout import layout_build
from opsboard_agent.sim.model import ClusterModel, SimConfig, SimSample, SimStep, Tick


def model_build(
    *faults: str, nodes: int = 2, gpus: int = 2, runs: int = 1, tp: int = 1, **config
) -> ClusterModel:
    layout = layout_build(nodes=nodes, gpus=gpus, runs=runs, tp=tp)
    config.setdefault("interval", 2.0)
    config.setdefault("check_every", 5)
    config.setdefault("checkpoint_every", 20)
    return ClusterModel(layout, [fault_parse(f, layout) for f in faults], SimConfig(**config))


def play(*faults: str, duration: float = 120.0, **kwargs) -> Tick:
    return model_build(*faults, **kwargs).advance(duration)


def by_step(steps: Iterable[SimStep]) -> dict[int, dict[int, dict]]:
    """{step: {rank: fields}}."""
    out: dict[int, dict[int, dict]] = defaultdict(dict)
    for report in steps:
        out[report.fields["step"]][report.rank] = {**report.fields, "t": report.t}
    return out


def series(
    samples: Iterable[SimSample], node: str, metric: str, gpu: int | None = None
) -> list[tuple[float, float]]:
    return [
        (s.t, s.value) for s in samples if s.node == node and s.metric == metric and s.gpu == gpu
    ]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def canary_differs(a: dict, b: dict, tolerance: float = 1e-4) -> bool:
    pairs = [(a["norm"], b["norm"]), *zip(a["proj"], b["proj"], strict=True)]
    return any(rel_diff(x, y) > tolerance for x, y in pairs)
