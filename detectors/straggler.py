"""Straggler: a rank (or a whole node) that computes slower than its peers.

In synchronous training every rank waits for the slowest at each collective, so the slow
rank is the one with the longest own work (compute) and the shortest wait. At every step we
take each rank's ratio of its compute time to the median of its peers'.

The rule is a window statistic, not a streak: over the last `straggler_steps` steps (N) the
rank's median ratio is at least 1 + `straggler_slowdown` **and** at least
`straggler_share` of the steps it reported are that slow. Why it holds under noise:
- One step is 1/N of the window: a healthy rank's single spike (a GC pause, a page-fault
  storm, pre-emption) cannot reach a majority, and a straggler's single fast step (jitter
  bringing it under the line) cannot break it. A streak rule restarted at every such step:
  with 85% of a straggler's steps over the line, 20 in a row happened ~4% of the time.
- A healthy rank with per-step jitter of CV 10% is over a 15% line in ~8% of steps; 75% of
  20 such steps (the default share) is a binomial tail of ~1e-10. At CV 30% (~31% of steps
  over the line) the tail at N = 20 is ~7e-5 per rank and window, and a 2-hour clean run of
  16 ranks (~100,000 windows) raised 3 false alerts. So N adapts to the measured noise:
  σ̂ is the robust spread (1.4826 × MAD) of log(compute / peers' median) of each rank
  around its own median over the newest N steps, and the window is N_eff = N × (σ̂ / σ_ref)²
  steps (`straggler_noise_ref`, σ_ref ≈ 0.12, about CV 10%: N_eff = N there), at least N
  and at most half the steps the window holds (the hysteresis looks back 2 × N_eff;
  ALERT_STEP_WINDOW = 120 gives 60), or, for a young run's shorter window, all of it up to
  `straggler_steps_max` (60), so its first windows are not judged at N = 20 either. Each
  rank is measured around its own median, so a straggler's (or a slow node's) steady offset
  is not mistaken for noise. At CV 30% N_eff is 60: a healthy rank needs 45 of 60 steps
  over the line where it expects ~19 (σ ≈ 3.6), a tail of ~1e-13 per window; a 1.5×
  straggler is over it in ~80% of steps (45 of 60: ~85% of windows), a 1.2× one in ~55%:
  the floor at CV 30% lies between them.
- With a majority of at least half, the median condition follows from the share one; it is
  kept explicit because the slowdown the finding reports is that median.
Hysteresis, without state: the finding stands while the rule held for a window ending at
any of the last N steps, so it resolves only once the rule has failed for a full window and
a borderline rank does not flap. The detector stays a pure function of the window (which
holds more than 2N steps: ALERT_STEP_WINDOW), so a replay as of any moment gives the same
answer as the live evaluation did, which a set of open alerts passed in could not promise.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from math import ceil, log
from operator import attrgetter
from typing import NamedTuple, cast

from detectors.common import (
    by_step,
    computes_of,
    median,
    pct,
    per_step,
    rank_nodes,
    run_subject,
    step_times,
)
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding, RunWindow, StepRow


class _Point(NamedTuple):
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
class _Held:
    """A straggling rank: the newest window in which the rule held, and since when."""

    points: tuple[_Point, ...]  # that window's reports of the rank, newest first
    slow: int  # how many of them are over the line
    since: _Point  # the first slow step of the first window of this episode
    holds_now: bool  # the rule holds at the newest step (else: within the hysteresis)


@dataclass(frozen=True)
class _Step:
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


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """`straggler` findings of every run of the window (see `detect_run`)."""
    return [f for run in window.runs for f in detect_run(run, now, config)]


def detect_run(
    run: RunWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """One warning per slow rank (`run:<run>/rank:<r>`), or one per node whose every rank is
    slow (`run:<run>/node:<n>`); evidence holds the slowdown, how many of the window's steps
    were slow, and the cost in GPU-hours per hour that the whole run loses waiting."""
    ratios = _Ratios(run, config)
    flagged = ratios.stragglers()
    if not flagged:
        return []
    noise = {"window_steps": ratios.n, "noise_sigma": round(ratios.sigma, 4)}
    nodes = rank_nodes(run)
    world = run.world_size or len(nodes)
    on_node: dict[str, list[int]] = defaultdict(list)
    for rank, node in nodes.items():
        on_node[node].append(rank)
    findings: list[Finding] = []
    done: set[int] = set()
    for node, ranks in sorted(on_node.items()):
        if len(ranks) >= 2 and all(r in flagged for r in ranks):
            findings.append(_node_finding(run.run, node, sorted(ranks), flagged, world, noise))
            done.update(ranks)
    for rank in sorted(set(flagged) - done):
        findings.append(_rank_finding(run.run, rank, nodes.get(rank), flagged[rank], world, noise))
    return findings


_RANK = attrgetter("rank")

# The noise estimate reads this many ranks at most (the lowest-numbered): 1,280 points
# pin σ̂ well, and a 1,024-rank run must not pay for 20,000 of them.
_NOISE_RANKS = 64
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution × this = its σ


class _Ratios:
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
        self.steps: list[_Step] = []
        self.points: dict[tuple[int, int], _Point | None] = {}

    def step(self, i: int) -> _Step | None:
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

    def point(self, i: int, rank: int) -> _Point | None:
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
                    point = _Point(step.number, ts, value, peers, step.step_time)
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
            for rank, value in step.values()
            if value >= floor and (p := self.point(i, rank)) is not None and p.ratio >= self.limit
        ]

    def window(self, rank: int, end: int) -> tuple[tuple[_Point, ...], int] | None:
        """(the rank's points, how many are slow) in the window of N steps whose newest is
        the end-th newest step; None when it runs past the oldest step or the rank reported
        too few of its steps to judge."""
        if self.step(end + self.n - 1) is None:
            return None
        points = tuple(p for i in range(end, end + self.n) if (p := self.point(i, rank)))
        if len(points) < ceil(self.n / 2):
            return None
        return points, sum(p.ratio >= self.limit for p in points)

    def held(self, rank: int, end: int) -> tuple[tuple[_Point, ...], int] | None:
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

    def alive_from(self, rank: int, end: int) -> tuple[int, tuple[tuple[_Point, ...], int]] | None:
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

    def stragglers(self) -> dict[int, _Held]:
        """rank → its episode, for the ranks whose finding stands at the newest step."""
        self.adapt()
        counts: dict[int, int] = defaultdict(int)
        for i in range(2 * self.n - 1):
            for rank in self.slow_ranks(i):
                counts[rank] += 1
        # Fewer slow steps than any held or kept window needs: no need to look closer.
        need = ceil(0.5 * ceil(self.n / 2))
        out: dict[int, _Held] = {}
        for rank in sorted(r for r, c in counts.items() if c >= need):
            newest = self.alive_from(rank, 0)
            if newest is not None:
                out[rank] = self._episode(rank, *newest)
        return out

    def _episode(self, rank: int, end: int, held: tuple[tuple[_Point, ...], int]) -> _Held:
        """Walk back through the held windows while the finding never lapsed between them:
        the first one's first slow step is `since`."""
        first, first_points = end, held[0]
        while (older := self.alive_from(rank, first + 1)) is not None:
            first, first_points = older[0], older[1][0]
        since = next(p for p in reversed(first_points) if p.ratio >= self.limit)
        return _Held(points=held[0], slow=held[1], since=since, holds_now=end == 0)


def _step_of(
    number: int, rows: list[StepRow], step_time: float, last: _Step | None
) -> _Step | None:
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
    return _Step(number, rows, ranks, known, at, sorted(unique), step_time)


def _median_without(ordered: list[float], value: float) -> float:
    """The median of `ordered` (sorted) without one instance of `value`: the peers' median."""
    i = bisect_left(ordered, value)
    rest = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    half = rest // 2
    return at(half) if rest % 2 else (at(half - 1) + at(half)) / 2


def _summary_numbers(held: _Held, world: int) -> dict[str, float | int | bool]:
    points = held.points
    slowdown = median([p.ratio - 1.0 for p in points])
    lost = median([(p.value - p.peers) / p.step_time for p in points if p.step_time > 0] or [0.0])
    return {
        "slowdown": round(slowdown, 4),
        "compute_time": round(median([p.value for p in points]), 6),
        "peer_median_compute_time": round(median([p.peers for p in points]), 6),
        "step_time": round(median([p.step_time for p in points]), 6),
        "steps": len(points),
        "slow_steps": held.slow,
        "since_step": held.since.step,
        "last_step": points[0].step,
        "holds_now": held.holds_now,
        # Every rank of the run waits (value − peers) each step for this one.
        "gpu_hours_lost_per_hour": round(world * max(lost, 0.0), 3),
        "world_size": world,
    }


def _rank_finding(
    run: str, rank: int, node: str | None, held: _Held, world: int, noise: dict[str, float]
) -> Finding:
    numbers = {**_summary_numbers(held, world), **noise}
    where = f" on {node}" if node else ""
    return Finding(
        kind="straggler",
        subject=run_subject(run, rank=rank),
        severity="warning",
        summary=(
            f"rank {rank}{where} computes {pct(float(numbers['slowdown']))} slower than the "
            f"median of its peers ({numbers['slow_steps']} of {numbers['steps']} steps slow), "
            f"costing the run {numbers['gpu_hours_lost_per_hour']:.1f} GPU-hours per hour"
        ),
        run=run,
        node=node,
        rank=rank,
        evidence={"rank": rank, "node": node, **numbers},
        since=held.since.ts,
    )


def _node_finding(
    run: str,
    node: str,
    ranks: list[int],
    flagged: dict[int, _Held],
    world: int,
    noise: dict[str, float],
) -> Finding:
    # The node's slowest rank gates every collective, so it sets the cost.
    worst = max(ranks, key=lambda r: median([p.ratio for p in flagged[r].points]))
    numbers = {**_summary_numbers(flagged[worst], world), **noise}
    slowdown = median([median([p.ratio - 1.0 for p in flagged[r].points]) for r in ranks])
    return Finding(
        kind="straggler",
        subject=run_subject(run, node=node),
        severity="warning",
        summary=(
            f"node {node} is slow: all its {len(ranks)} ranks compute {pct(slowdown)} slower "
            f"than their peers (heterogeneous or degraded hardware), costing the run "
            f"{numbers['gpu_hours_lost_per_hour']:.1f} GPU-hours per hour"
        ),
        run=run,
        node=node,
        evidence={
            "node": node,
            "ranks": ranks,
            "node_slowdown": round(slowdown, 4),
            "slowest_rank": worst,
            **numbers,
        },
        since=min(flagged[r].since.ts for r in ranks),
    )
