"""Goodput: the share of wall time that made lasting training progress, and where the rest
went. A pure function for the run summary, not a finding."""

from __future__ import annotations

from dataclasses import dataclass, field

from detectors.common import by_step, median
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import RunWindow

BUCKETS = ("data", "checkpoint", "recovery", "wasted", "hang", "idle")


@dataclass(frozen=True)
class Goodput:
    """Seconds of wall time since `start`: `productive` plus one entry per badput bucket —
    data (waiting for and staging input), checkpoint (blocking saves), recovery (from a
    restart to the next step), wasted (steps redone after resuming from an older
    checkpoint), hang (stalls past the hang limit), idle (every other gap) — and each as a
    fraction of `wall`."""

    start: float
    wall: float
    productive: float
    goodput: float
    badput: dict[str, float] = field(default_factory=dict)
    fractions: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "start": self.start,
            "wall_s": round(self.wall, 3),
            "productive_s": round(self.productive, 3),
            "goodput": round(self.goodput, 4),
            "badput_s": {k: round(v, 3) for k, v in self.badput.items()},
            "badput": {k: round(v, 4) for k, v in self.fractions.items()},
        }


@dataclass(frozen=True)
class _Instance:
    """One completion of a step number (the run's median over its ranks)."""

    step: int
    end: float
    step_time: float
    data: float
    wasted: bool = False


def _instances(run: RunWindow, restarts: list[float]) -> list[_Instance]:
    # A restart starts a new epoch: the same step number in two epochs is two completions.
    def epoch(ts: float) -> int:
        return sum(1 for r in restarts if r <= ts)

    groups: dict[tuple[int, int], list] = {}
    for number, rows in by_step(run.steps).items():
        for row in rows:
            groups.setdefault((epoch(row.ts), number), []).append(row)
    out = []
    for (_, number), rows in groups.items():
        data = [(r.data_time or 0.0) + (r.h2d_time or 0.0) for r in rows]
        out.append(
            _Instance(
                number,
                median([r.ts for r in rows]),
                median([r.step_time for r in rows]),
                median(data),
            )
        )
    out.sort(key=lambda i: i.end)
    # Only the last completion of a step number made lasting progress.
    last_of = {i.step: k for k, i in enumerate(out)}
    return [
        _Instance(i.step, i.end, i.step_time, i.data, wasted=last_of[i.step] != k)
        for k, i in enumerate(out)
    ]


def goodput(
    run: RunWindow,
    now: float,
    since: float | None = None,
    config: DetectorConfig = DEFAULT_CONFIG,
) -> Goodput:
    """Goodput of `run` over [since, now]; `since` defaults to the run's start (or its first
    step). The window must hold every step and event from `since` on."""
    restarts = sorted(e.ts for e in run.events if e.kind == "restart")
    instances = _instances(run, restarts)
    start = since if since is not None else run.started_at
    if start is None:
        start = min((i.end - i.step_time for i in instances), default=now)
    saves = _saves(run, now)
    typical = median([i.step_time for i in instances[-20:]]) if instances else 0.0
    hang_limit = max(config.hang_factor * typical, config.hang_min_s)
    buckets = dict.fromkeys(BUCKETS, 0.0)
    productive = 0.0
    cursor = start

    def gap(a: float, b: float) -> None:
        """Attribute [a, b], where no step ran: recovery after a restart, checkpoint saves,
        then a hang when what is left is long, idle otherwise."""
        if b <= a:
            return
        restart = next((r for r in restarts if a <= r < b), None)
        if restart is not None:
            buckets["recovery"] += b - restart
            b = restart
        saving = sum(max(0.0, min(b, e) - max(a, s)) for s, e in saves)
        saving = min(saving, b - a)
        buckets["checkpoint"] += saving
        rest = (b - a) - saving
        buckets["hang" if rest > hang_limit else "idle"] += rest

    for inst in instances:
        if inst.end <= start:
            continue
        begin = max(inst.end - inst.step_time, cursor)
        gap(cursor, begin)
        covered = max(0.0, min(inst.end, now) - begin)
        share = covered / inst.step_time if inst.step_time > 0 else 0.0
        if inst.wasted:
            buckets["wasted"] += covered
        else:
            buckets["data"] += inst.data * share
            productive += covered - inst.data * share
        cursor = max(cursor, inst.end)
    gap(cursor, now)
    wall = max(0.0, now - start)
    fractions = {k: (v / wall if wall > 0 else 0.0) for k, v in buckets.items()}
    return Goodput(
        start=start,
        wall=wall,
        productive=productive,
        goodput=productive / wall if wall > 0 else 0.0,
        badput=buckets,
        fractions=fractions,
    )


def _saves(run: RunWindow, now: float) -> list[tuple[float, float]]:
    """(start, end) of local (blocking) checkpoint saves; an unfinished one runs to `now`."""
    started: dict[object, float] = {}
    out = []
    for event in sorted(run.events, key=lambda e: e.ts):
        if event.kind != "checkpoint" or event.data.get("tier", "local") != "local":
            continue
        state = event.data.get("state")
        if state == "started":
            started[event.step] = event.ts
        elif state in ("completed", "failed"):
            begin = started.pop(event.step, None)
            if begin is None and event.data.get("duration") is not None:
                begin = event.ts - float(event.data["duration"])
            if begin is not None:
                out.append((begin, event.ts))
    out += [(begin, now) for begin in started.values()]
    return out
