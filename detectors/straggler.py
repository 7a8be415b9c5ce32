"""Straggler: a rank (or a whole node) that computes slower than its peers.

In synchronous training every rank waits for the slowest at each collective, so the slow
rank is the one with the longest own work (compute) and the shortest wait. We compare each
rank's compute time with the median of its peers at every step, newest first, and flag a
rank that stays at least `straggler_slowdown` slower for `straggler_steps` steps in a row.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict

from detectors.common import by_step, compute_of, median, pct, rank_nodes, run_subject
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding, RunWindow

# (step, ts, own compute, peers' median compute, run step time) of one slow step
_Slow = tuple[int, float, float, float, float]


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """`straggler` findings of every run of the window (see `detect_run`)."""
    return [f for run in window.runs for f in detect_run(run, now, config)]


def detect_run(
    run: RunWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """One warning per slow rank (`run:<run>/rank:<r>`), or one per node whose every rank is
    slow (`run:<run>/node:<n>`); evidence holds the slowdown and the cost in GPU-hours per
    hour that the whole run loses waiting."""
    streaks = _slow_streaks(run, config)
    flagged = {r: s for r, s in streaks.items() if len(s) >= config.straggler_steps}
    if not flagged:
        return []
    nodes = rank_nodes(run)
    world = run.world_size or len(nodes)
    on_node: dict[str, list[int]] = defaultdict(list)
    for rank, node in nodes.items():
        on_node[node].append(rank)
    findings: list[Finding] = []
    done: set[int] = set()
    for node, ranks in sorted(on_node.items()):
        if len(ranks) >= 2 and all(r in flagged for r in ranks):
            findings.append(_node_finding(run.run, node, sorted(ranks), flagged, world))
            done.update(ranks)
    for rank in sorted(set(flagged) - done):
        findings.append(_rank_finding(run.run, rank, nodes.get(rank), flagged[rank], world))
    return findings


def _slow_streaks(run: RunWindow, config: DetectorConfig) -> dict[int, list[_Slow]]:
    """Each rank's unbroken run of slow steps ending at the newest step, newest first.

    Walking back stops as soon as no rank is still slow, so a healthy run costs one median
    of the newest step."""
    limit = 1.0 + config.straggler_slowdown
    steps = by_step(run.steps)
    streaks: dict[int, list[_Slow]] = defaultdict(list)
    candidates: set[int] | None = None  # None: the newest step, every rank may be slow
    for number in sorted(steps, reverse=True):
        rows = steps[number]
        values = {r.rank: (v, r.ts) for r in rows if (v := compute_of(r)) is not None}
        if len(values) < 2:
            continue  # no peers to compare with: neither evidence nor a break
        ordered = sorted(v for v, _ in values.values())
        middle = ordered[len(ordered) // 2]
        step_time = median([r.step_time for r in rows])
        slow: set[int] = set()
        for rank, (value, ts) in values.items():
            if (candidates is not None and rank not in candidates) or value < middle:
                continue
            peers = _median_without(ordered, value)
            if peers > 0 and value >= limit * peers:
                slow.add(rank)
                streaks[rank].append((number, ts, value, peers, step_time))
        # A candidate without a report at this step keeps its streak: missing data is no
        # evidence that it caught up.
        candidates = slow if candidates is None else slow | (candidates - values.keys())
        if not candidates:
            break
    return streaks


def _median_without(ordered: list[float], value: float) -> float:
    """The median of `ordered` (sorted) without one instance of `value`: the peers' median."""
    i = bisect_left(ordered, value)
    rest = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    half = rest // 2
    return at(half) if rest % 2 else (at(half - 1) + at(half)) / 2


def _summary_numbers(streak: list[_Slow], world: int) -> dict[str, float | int]:
    slowdown = median([value / peers - 1.0 for _, _, value, peers, _ in streak])
    lost = median([(value - peers) / st for _, _, value, peers, st in streak if st > 0] or [0.0])
    return {
        "slowdown": round(slowdown, 4),
        "compute_time": round(median([s[2] for s in streak]), 6),
        "peer_median_compute_time": round(median([s[3] for s in streak]), 6),
        "step_time": round(median([s[4] for s in streak]), 6),
        "steps": len(streak),
        "since_step": streak[-1][0],
        "last_step": streak[0][0],
        # Every rank of the run waits (value − peers) each step for this one.
        "gpu_hours_lost_per_hour": round(world * lost, 3),
        "world_size": world,
    }


def _rank_finding(
    run: str, rank: int, node: str | None, streak: list[_Slow], world: int
) -> Finding:
    numbers = _summary_numbers(streak, world)
    where = f" on {node}" if node else ""
    return Finding(
        kind="straggler",
        subject=run_subject(run, rank=rank),
        severity="warning",
        summary=(
            f"rank {rank}{where} computes {pct(float(numbers['slowdown']))} slower than the "
            f"median of its peers for {numbers['steps']} steps, costing the run "
            f"{numbers['gpu_hours_lost_per_hour']:.1f} GPU-hours per hour"
        ),
        run=run,
        node=node,
        rank=rank,
        evidence={"rank": rank, "node": node, **numbers},
        since=streak[-1][1],
    )


def _node_finding(
    run: str, node: str, ranks: list[int], flagged: dict[int, list[_Slow]], world: int
) -> Finding:
    # The node's slowest rank gates every collective, so it sets the cost.
    worst = max(ranks, key=lambda r: median([s[2] / s[3] for s in flagged[r]]))
    numbers = _summary_numbers(flagged[worst], world)
    slowdown = median([median([s[2] / s[3] - 1.0 for s in flagged[r]]) for r in ranks])
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
        since=min(flagged[r][-1][1] for r in ranks),
    )
