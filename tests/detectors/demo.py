"""`make demo`'s cluster without a stack: the simulator as `launcher.stack` starts it (8
nodes × 8 GPUs, two runs, seed 1, a sample a second, noise on, DEMO_FAULTS), and the window
the alerts service would read of it at any moment, fresh or after a restart.

A restart is `make demo` stopped after `first` seconds and started again `gap` seconds
later: the simulator begins again at its second 0 with the same seed and faults, so the
server holds the first session's telemetry and events, then the second's; a run's step
window holds only its current timeline (`apps.alerts.selectors.steps`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from detectors.types import ClusterWindow, NodeSeen, Series
from launcher.stack import DEMO_FAULTS
from opsboard_agent.sim.faults import fault_parse
from opsboard_agent.sim.layout import Layout, layout_build
from opsboard_agent.sim.model import ClusterModel, SimConfig
from opsboard_agent.sim.noise import Noise
from tests.detectors.simwin import BASE_TS, window_of

DEMO_SEED, DEMO_INTERVAL = 1, 1.0
# The alerts service's windows (opsboard.tunables): telemetry, events, steps a rank.
TELEMETRY_S, EVENTS_S, STEP_WINDOW = 600.0, 900.0, 120


def demo_layout() -> Layout:
    return layout_build(nodes=8, gpus=8, runs=2, prefix="demo")


def demo_model(seed: int = DEMO_SEED, faults: tuple[str, ...] = DEMO_FAULTS) -> ClusterModel:
    layout = demo_layout()
    config = SimConfig(seed=seed, interval=DEMO_INTERVAL, noise=Noise(cv=0.1, spike_rate=0.01))
    return ClusterModel(layout, [fault_parse(f, layout) for f in faults], config)


@dataclass(frozen=True)
class DemoPlay:
    """The demo's records (and an earlier session's, before `start`, if it was restarted);
    `start` is the Unix time of its second 0."""

    window: ClusterWindow
    start: float

    def at(self, now: float) -> ClusterWindow:
        """The window as the alerts service reads it at `now`."""
        full = self.window
        runs = []
        for run in full.runs:
            rows = [s for s in run.steps if self.start <= s.ts <= now]
            top = max((s.step for s in rows), default=0)
            runs.append(
                replace(
                    run,
                    steps=tuple(s for s in rows if s.step > top - STEP_WINDOW),
                    events=tuple(e for e in run.events if now - EVENTS_S <= e.ts <= now),
                )
            )
        telemetry = tuple(
            with_points(s, [p for p in s.points if now - TELEMETRY_S <= p[0] <= now])
            for s in full.telemetry
        )
        seen: dict[str, float] = {}
        for s in telemetry:
            if s.points:
                seen[s.node] = max(seen.get(s.node, s.points[-1][0]), s.points[-1][0])
        return ClusterWindow(
            cluster="demo",
            runs=tuple(runs),
            telemetry=telemetry,
            nodes=tuple(NodeSeen(n.node, seen.get(n.node), DEMO_INTERVAL) for n in full.nodes),
            events=tuple(e for e in full.events if now - EVENTS_S <= e.ts <= now),
        )


def demo_play(
    duration: float, *, seed: int = DEMO_SEED, restart: tuple[float, float] | None = None
) -> DemoPlay:
    """`duration` seconds of the demo from its start at BASE_TS; with `restart = (first,
    gap)`, after a session of `first` seconds that ended `gap` seconds before it."""
    layout = demo_layout()
    window = window_of(layout, demo_model(seed).advance(duration), DEMO_INTERVAL)
    if restart is None:
        return DemoPlay(window, BASE_TS)
    first, gap = restart
    shift = first + gap  # the earlier session began this long before the restart
    old = window_of(layout, demo_model(seed).advance(first), DEMO_INTERVAL)

    def earlier(ts: float) -> float:
        return ts - shift

    merged = replace(
        window,
        runs=tuple(
            replace(
                new, events=tuple(replace(e, ts=earlier(e.ts)) for e in gone.events) + new.events
            )
            for gone, new in zip(old.runs, window.runs, strict=True)
        ),
        telemetry=tuple(
            with_points(new, [(earlier(t), v) for t, v in gone.points] + list(new.points))
            for gone, new in _paired(old.telemetry, window.telemetry)
        ),
        events=tuple(replace(e, ts=earlier(e.ts)) for e in old.events) + window.events,
    )
    return DemoPlay(merged, BASE_TS)


def _paired(old: tuple[Series, ...], new: tuple[Series, ...]) -> list[tuple[Series, Series]]:
    """Each new series with the earlier session's of the same key (or an empty one)."""
    by_key = {(s.node, s.gpu, s.metric): s for s in old}
    return [(by_key.get((s.node, s.gpu, s.metric), with_points(s, [])), s) for s in new]


def with_points(series: Series, points: list[tuple[float, float]]) -> Series:
    """The series with other points (a Series holds columns: no dataclasses.replace)."""
    return Series(series.node, series.metric, series.gpu, points)
