"""Goodput: the share of wall time that made lasting training progress, and where the rest
went. A pure function for the run summary, not a finding."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from operator import attrgetter

from detectors.common import by_step, median, step_times
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import EventRow, RunWindow, StepRow

_TS = attrgetter("ts")
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
class Completion:
    """One completion of a step number: the medians over the ranks that reported it (a
    restart starts a new epoch, and the same step number in two epochs is two completions).
    `wasted`: a later completion of the same number redid it."""

    step: int
    end: float
    step_time: float
    data: float  # data loading plus host-to-device staging
    wasted: bool = False


def restarts_of(events: Iterable[EventRow]) -> list[float]:
    return sorted(e.ts for e in events if e.kind == "restart")


def completions(run: RunWindow) -> list[Completion]:
    """The run's step completions from every rank's rows, as `completions_marked` orders
    and marks them."""
    restarts = restarts_of(run.events)
    steps = by_step(run.steps)
    if not restarts:  # one epoch: a step's rows are one completion
        times = step_times(run.steps)
        return completions_marked(
            _completion(number, rows, times[number]) for number, rows in steps.items()
        )

    def epoch(ts: float) -> int:
        return sum(1 for r in restarts if r <= ts)

    groups: dict[tuple[int, int], list[StepRow]] = {}
    for number, rows in steps.items():
        for row in rows:
            groups.setdefault((epoch(row.ts), number), []).append(row)
    return completions_marked(
        _completion(number, rows, median([r.step_time for r in rows]))
        for (_, number), rows in groups.items()
    )


def _completion(number: int, rows: list[StepRow], step_time: float) -> Completion:
    """A completion from the rows that reported it and their median step_time."""
    return Completion(
        number,
        median(list(map(_TS, rows))),
        step_time,
        median([(r.data_time or 0.0) + (r.h2d_time or 0.0) for r in rows]),
    )


def completions_marked(found: Iterable[Completion]) -> list[Completion]:
    """Completions in the order they ended, each but the last of its step number wasted
    (only that one made lasting progress)."""
    out = sorted(found, key=lambda c: c.end)
    last_of = {c.step: k for k, c in enumerate(out)}
    return [replace(c, wasted=last_of[c.step] != k) for k, c in enumerate(out)]


def goodput(
    run: RunWindow,
    now: float,
    since: float | None = None,
    config: DetectorConfig = DEFAULT_CONFIG,
) -> Goodput:
    """Goodput of `run` over [since, now]; `since` defaults to the run's start (or its first
    step). The window must hold every step and event from `since` on."""
    return goodput_of(
        completions(run), run.events, now, since=since, started_at=run.started_at, config=config
    )


def goodput_of(
    done: list[Completion],
    events: Iterable[EventRow],
    now: float,
    *,
    since: float | None = None,
    started_at: float | None = None,
    config: DetectorConfig = DEFAULT_CONFIG,
) -> Goodput:
    """Goodput over [since, now] from a run's completions (as `completions_marked` leaves
    them) and its events; `since` defaults to `started_at`, else the first step's start."""
    events = sorted(events, key=lambda e: e.ts)
    restarts = restarts_of(events)
    start = since if since is not None else started_at
    if start is None:
        start = min((c.end - c.step_time for c in done), default=now)
    saves = _saves(events, now)
    typical = median([c.step_time for c in done[-20:]]) if done else 0.0
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

    for done_step in done:
        if done_step.end <= start:
            continue
        begin = max(done_step.end - done_step.step_time, cursor)
        gap(cursor, begin)
        covered = max(0.0, min(done_step.end, now) - begin)
        share = covered / done_step.step_time if done_step.step_time > 0 else 0.0
        if done_step.wasted:
            buckets["wasted"] += covered
        else:
            buckets["data"] += done_step.data * share
            productive += covered - done_step.data * share
        cursor = max(cursor, done_step.end)
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


def _saves(events: list[EventRow], now: float) -> list[tuple[float, float]]:
    """(start, end) of local (blocking) checkpoint saves (`events` in time order); an
    unfinished one runs to `now`."""
    started: dict[object, float] = {}
    out = []
    for event in events:
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
