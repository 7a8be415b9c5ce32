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

from collections import defaultdict

from detectors.common import median, pct, rank_nodes, run_subject
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.straggler_window import Held, Ratios
from detectors.types import ClusterWindow, Finding, RunWindow


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
    ratios = Ratios(run, config)
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


def _summary_numbers(held: Held, world: int) -> dict[str, float | int | bool]:
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
    run: str, rank: int, node: str | None, held: Held, world: int, noise: dict[str, float]
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
    flagged: dict[int, Held],
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
