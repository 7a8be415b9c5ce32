"""Goodput: the share of wall time that made lasting training progress, and where the rest
went. A pure function for the run summary, not a finding."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from operator import attrgetter

from detectors.common import by_step, median, shared_results, step_times
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import EventRow, RunWindow, StepRow

_TS = attrgetter("ts")
BUCKETS = ("data", "checkpoint", "recovery", "hang", "idle")
# An inferred restart (the step counter went back; no `restart` event) is placed just after
# the old timeline's newest report: half a microsecond, below the stored times' resolution,
# so that report stays in the old epoch and the new timeline's first is in the new one.
INFERRED_AFTER_S = 0.5e-6


@dataclass(frozen=True)
class Goodput:
    """Seconds of wall time since `start`: `productive` plus one entry per badput bucket —
    data (waiting for and staging input), checkpoint (blocking saves), recovery (from a
    restart to the next step, and the work the restart lost: the steps done past the
    checkpoint it resumed from, which must be done again), hang (stalls past the hang
    limit), idle (every other gap) — and each as a fraction of `wall`."""

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
            # `wasted`: kept, always 0, for readers of the contract from before the work a
            # restart lost was booked as recovery (docs/contract.md)
            "badput_s": {**{k: round(v, 3) for k, v in self.badput.items()}, "wasted": 0.0},
            "badput": {**{k: round(v, 4) for k, v in self.fractions.items()}, "wasted": 0.0},
        }


@dataclass(frozen=True)
class Completion:
    """One completion of a step number in one epoch (the time between two restarts): the
    medians over the ranks that reported it. `lost`: a later epoch resumed from a checkpoint
    at or below this step, so the work was thrown away (it is booked as recovery)."""

    step: int
    end: float
    step_time: float
    data: float  # data loading plus host-to-device staging
    epoch: int = 0
    lost: bool = False


def restarts_of(events: Iterable[EventRow], timeline_after: float | None = None) -> list[float]:
    """The run's restarts, in time order: its `restart` events, and the restart inferred
    from its step counter going back (`timeline_after`: the old timeline's newest report)
    unless a `restart` event after that report already stands for it."""
    restarts = sorted(e.ts for e in events if e.kind == "restart")
    if timeline_after is not None and not any(r > timeline_after for r in restarts):
        restarts = sorted([*restarts, timeline_after + INFERRED_AFTER_S])
    return restarts


def completions(run: RunWindow, restarts: list[float] | None = None) -> list[Completion]:
    """The run's step completions from every rank's rows, as `completions_marked` orders
    and marks them; `restarts` default to the run's `restart` events."""
    restarts = restarts_of(run.events) if restarts is None else restarts
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
        _completion(number, rows, median([r.step_time for r in rows]), epoch)
        for (epoch, number), rows in groups.items()
    )


def _completion(number: int, rows: list[StepRow], step_time: float, epoch: int = 0) -> Completion:
    """A completion from the rows that reported it and their median step_time."""
    return Completion(
        number,
        median(list(map(_TS, rows))),
        step_time,
        median([(r.data_time or 0.0) + (r.h2d_time or 0.0) for r in rows]),
        epoch,
    )


def completions_marked(found: Iterable[Completion]) -> list[Completion]:
    """Completions in the order they ended, those a later epoch threw away marked `lost`:
    a completion is lost when a later epoch (one that has stepped) reports a step number
    at or below its own, i.e. resumed from a checkpoint taken before it. The old timeline's
    steps past the checkpoint are lost at once, whether or not they have been redone yet."""
    out = sorted(found, key=lambda c: c.end)
    first_of: dict[int, int] = {}  # epoch → its lowest step number
    for c in out:
        first_of[c.epoch] = min(first_of.get(c.epoch, c.step), c.step)
    resumed_at: dict[int, float] = {}  # epoch → the lowest step any later epoch reported
    lowest = math.inf
    for epoch in sorted(first_of, reverse=True):
        resumed_at[epoch] = lowest
        lowest = min(lowest, first_of[epoch])
    return [replace(c, lost=c.step >= resumed_at[c.epoch]) for c in out]


def goodput(
    run: RunWindow,
    now: float,
    since: float | None = None,
    config: DetectorConfig = DEFAULT_CONFIG,
    timeline_after: float | None = None,
) -> Goodput:
    """Goodput of `run` over [since, now]; `since` defaults to the run's start (or its first
    step). The window must hold every step and event from `since` on; `timeline_after`: the
    run's inferred restart (see restarts_of)."""
    restarts = restarts_of(run.events, timeline_after)
    with shared_results():
        done = completions(run, restarts)
    return goodput_of(
        done,
        run.events,
        now,
        since=since,
        started_at=run.started_at,
        restarts=restarts,
        config=config,
    )


def goodput_of(
    done: list[Completion],
    events: Iterable[EventRow],
    now: float,
    *,
    since: float | None = None,
    started_at: float | None = None,
    restarts: list[float] | None = None,
    config: DetectorConfig = DEFAULT_CONFIG,
) -> Goodput:
    """Goodput over [since, now] from a run's completions (as `completions_marked` leaves
    them) and its events; `since` defaults to `started_at`, else the first step's start;
    `restarts` (restarts_of) default to the `restart` events. Lost completions, and the
    time from a restart to the next step, are recovery."""
    events = sorted(events, key=lambda e: e.ts)
    restarts = restarts_of(events) if restarts is None else restarts
    start = since if since is not None else started_at
    if start is None:
        start = min((c.end - c.step_time for c in done), default=now)
    saves = checkpoint_saves(events, now)
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
        if done_step.lost:
            buckets["recovery"] += covered
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


def checkpoint_saves(events: list[EventRow], now: float) -> list[tuple[float, float]]:
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
