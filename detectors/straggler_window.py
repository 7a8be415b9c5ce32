"""The straggler rule's window (detectors/straggler.py's docstring says the rule): each
rank's compute against its peers' median, step by step, newest first, built only as far
back as a decision needs, with the noise estimate that sizes the window and the
hysteresis that keeps a finding standing.

Pure: plain step rows in, named tuples and frozen dataclasses out.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property, partial
from math import ceil, log
from operator import attrgetter
from typing import NamedTuple, cast

import numpy as np

from detectors.common import by_step, computes_of, median, per_step, step_times
from detectors.config import DetectorConfig
from detectors.types import RunWindow, StepRow


class Point(NamedTuple):
    """One rank at one step: its compute, its peers' median, the run's step time. (A named
    tuple: a straggler's episode and the noise estimate make thousands.)"""

    step: int
    ts: float
    value: float
    peers: float
    step_time: float

    @property
    def ratio(self) -> float:
        return self.value / self.peers


@dataclass(frozen=True)
class Held:
    """A straggling rank: the newest window in which the rule held, and since when."""

    points: tuple[Point, ...]  # that window's reports of the rank, newest first
    slow: int  # how many of them are over the line
    since: Point  # the first slow step of the first window of this episode
    holds_now: bool  # the rule holds at the newest step (else: within the hysteresis)


@dataclass(frozen=True)
class Step:
    """A step's reports with a compute, as parallel lists (per-rank tuples would cost a
    1,024-rank window ~60k allocations)."""

    number: int
    rows: list[StepRow]
    ranks: list[int]
    computes: list[float]
    at: dict[int, int]  # rank → index of its report (its last, if it sent two)
    ordered: list[float]  # the compute of each rank (its last report), sorted
    step_time: float

    def values(self) -> Iterator[tuple[int, float]]:
        """(rank, compute) of each rank, in the order each first reported."""
        if len(self.at) == len(self.ranks):
            return zip(self.ranks, self.computes, strict=True)
        return ((rank, self.computes[i]) for rank, i in self.at.items())

    @cached_property
    def _computes(self) -> np.ndarray:
        return np.asarray(self.computes, dtype=np.float64)

    def ranks_at_least(self, floor: float) -> list[int]:
        """The ranks whose compute (their last report's) is at least `floor`, in the order
        each first reported: one numpy pass when each rank reported once (the usual step),
        where a 16,384-rank step with one slow rank walked every rank in Python."""
        if len(self.at) != len(self.ranks):
            return [rank for rank, value in self.values() if value >= floor]
        return [self.ranks[i] for i in np.flatnonzero(self._computes >= floor).tolist()]


_RANK = attrgetter("rank")

# The noise estimate reads this many ranks at most (the lowest-numbered): 1,280 points
# pin σ̂ well, and a 1,024-rank run must not pay for 20,000 of them.
_NOISE_RANKS = 64
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution × this = its σ


class Ratios:
    """The run's steps with peers to compare, newest first, built only as far back as asked
    (a healthy run costs 2N − 1 sorted steps; a straggler's episode, as far as it goes)."""

    def __init__(self, run: RunWindow, config: DetectorConfig) -> None:
        self.n = config.straggler_steps
        self.base_n = config.straggler_steps
        self.noise_ref = config.straggler_noise_ref
        self.steps_max = config.straggler_steps_max
        self.sigma = 0.0
        self.limit = 1.0 + config.straggler_slowdown
        self.share = config.straggler_share
        self.by_step = by_step(run.steps)
        self.step_times = step_times(run.steps)
        self.numbers = sorted(self.by_step, reverse=True)
        self.cursor = 0
        self.steps: list[Step] = []
        self.points: dict[tuple[int, int], Point | None] = {}

    def step(self, i: int) -> Step | None:
        """The i-th newest step that has at least two ranks' compute; None past the end."""
        while len(self.steps) <= i and self.cursor < len(self.numbers):
            number = self.numbers[self.cursor]
            self.cursor += 1
            rows: list[StepRow] = self.by_step[number]
            last = self.steps[-1] if self.steps else None
            step_time = self.step_times[number]
            step = per_step("straggler", rows, partial(_step_of, number, rows, step_time, last))
            if step is not None:
                self.steps.append(step)
        return self.steps[i] if i < len(self.steps) else None

    def point(self, i: int, rank: int) -> Point | None:
        key = (i, rank)
        if key not in self.points:
            step = self.step(i)
            point = None
            if step is not None and rank in step.at:
                index = step.at[rank]
                value = step.computes[index]
                peers = _median_without(step.ordered, value)
                if peers > 0:
                    ts = step.rows[index].ts
                    point = Point(step.number, ts, value, peers, step.step_time)
            self.points[key] = point
        return self.points[key]

    def slow_ranks(self, i: int) -> list[int]:
        """Ranks over the line at the i-th newest step."""
        step = self.step(i)
        if step is None:
            return []
        # Taking one value out leaves a median of at least this: below it × limit, not slow.
        floor = self.limit * step.ordered[(len(step.ordered) - 2) // 2]
        if step.ordered[-1] < floor:  # the usual step: no one is near the line
            return []
        return [
            rank
            for rank in step.ranks_at_least(floor)
            if (p := self.point(i, rank)) is not None and p.ratio >= self.limit
        ]

    def window(self, rank: int, end: int) -> tuple[tuple[Point, ...], int] | None:
        """(the rank's points, how many are slow) in the window of N steps whose newest is
        the end-th newest step; None when it runs past the oldest step or the rank reported
        too few of its steps to judge."""
        if self.step(end + self.n - 1) is None:
            return None
        points = tuple(p for i in range(end, end + self.n) if (p := self.point(i, rank)))
        if len(points) < ceil(self.n / 2):
            return None
        return points, sum(p.ratio >= self.limit for p in points)

    def held(self, rank: int, end: int) -> tuple[tuple[Point, ...], int] | None:
        """The window (see `window`) when the rule holds there, else None."""
        found = self.window(rank, end)
        if found is None:
            return None
        points, slow = found
        if slow < self.share * len(points) or median([p.ratio for p in points]) < self.limit:
            return None
        return found

    def kept(self, rank: int, end: int) -> bool:
        """The release rule: the rank is still slow in most steps of the window (its median
        ratio is over the line), so an open finding stays open past its grace window."""
        found = self.window(rank, end)
        return found is not None and median([p.ratio for p in found[0]]) >= self.limit

    def alive_from(self, rank: int, end: int) -> tuple[int, tuple[tuple[Point, ...], int]] | None:
        """The newest window at or before the end-th newest step in which the rule held, if
        the finding it opened still stands at `end`: the rule held within the last N windows,
        or every window since that grace was kept."""
        unkept: int | None = None  # the newest window, from `end` back, that was not kept
        probe = end
        while self.step(probe + self.n - 1) is not None:
            if unkept is not None and probe >= unkept + self.n:
                return None
            if (held := self.held(rank, probe)) is not None:
                return probe, held
            if unkept is None and not self.kept(rank, probe):
                unkept = probe
            probe += 1
        return None

    def noise(self) -> float:
        """σ̂: 1.4826 × the median absolute deviation of log(compute / peers' median) of
        each rank from its own median, over the newest N steps (0 with too few points)."""
        ranks: set[int] = set()
        for i in range(self.base_n):
            if (step := self.step(i)) is not None:
                ranks.update(step.at)
        deviations: list[float] = []
        for rank in sorted(ranks)[:_NOISE_RANKS]:
            logs = [
                log(p.ratio)
                for i in range(self.base_n)
                if (p := self.point(i, rank)) is not None and p.value > 0
            ]
            if len(logs) >= 3:
                centre = median(logs)
                deviations.extend(abs(x - centre) for x in logs)
        return _MAD_TO_SIGMA * median(deviations) if deviations else 0.0

    def adapt(self) -> None:
        """Lengthen the window for the measured noise (see the module docstring)."""
        self.sigma = self.noise()
        # Half the window leaves the hysteresis its 2 × N_eff; a young run's short window
        # is used whole (up to `straggler_steps_max`): it has no older episode to keep.
        held = len(self.numbers)
        longest = max(self.base_n, held // 2, min(held, self.steps_max))
        wanted = ceil(self.base_n * (self.sigma / self.noise_ref) ** 2) if self.noise_ref else 0
        self.n = min(longest, max(self.base_n, wanted))

    def stragglers(self) -> dict[int, Held]:
        """rank → its episode, for the ranks whose finding stands at the newest step."""
        self.adapt()
        counts: dict[int, int] = defaultdict(int)
        for i in range(2 * self.n - 1):
            for rank in self.slow_ranks(i):
                counts[rank] += 1
        # Fewer slow steps than any held or kept window needs: no need to look closer.
        need = ceil(0.5 * ceil(self.n / 2))
        out: dict[int, Held] = {}
        for rank in sorted(r for r, c in counts.items() if c >= need):
            newest = self.alive_from(rank, 0)
            if newest is not None:
                out[rank] = self._episode(rank, *newest)
        return out

    def _episode(self, rank: int, end: int, held: tuple[tuple[Point, ...], int]) -> Held:
        """Walk back through the held windows while the finding never lapsed between them:
        the first one's first slow step is `since`."""
        first, first_points = end, held[0]
        while (older := self.alive_from(rank, first + 1)) is not None:
            first, first_points = older[0], older[1][0]
        since = next(p for p in reversed(first_points) if p.ratio >= self.limit)
        return Held(points=held[0], slow=held[1], since=since, holds_now=end == 0)


def _step_of(number: int, rows: list[StepRow], step_time: float, last: Step | None) -> Step | None:
    """The step's reports with a compute (None without two ranks to compare: neither
    evidence nor a break); `last`, the step built before it, lends its rank index when the
    ranks reported in the same order (they mostly do)."""
    values = computes_of(rows)
    if None in values:
        rows = [r for r, v in zip(rows, values, strict=True) if v is not None]
    computes = [v for v in values if v is not None] if len(rows) < len(values) else values
    ranks = list(map(_RANK, rows))
    if last is not None and last.ranks == ranks:
        at = last.at
    else:
        at = dict(zip(ranks, range(len(ranks)), strict=True))
    if len(at) < 2:
        return None
    known = cast(list[float], computes)
    unique = known if len(at) == len(ranks) else [known[i] for i in at.values()]
    return Step(number, rows, ranks, known, at, sorted(unique), step_time)


def _median_without(ordered: list[float], value: float) -> float:
    """The median of `ordered` (sorted) without one instance of `value`: the peers' median."""
    i = bisect_left(ordered, value)
    rest = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    half = rest // 2
    return at(half) if rest % 2 else (at(half - 1) + at(half)) / 2
