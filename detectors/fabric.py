"""Fabric: the collectives themselves got slower while compute did not.

Every rank waits in a collective for the slowest rank to be ready, and then for the
collective's own time. The rank that is ready last waits only the latter, so the smallest
`comm_wait` of a step measures the interconnect, untouched by a straggler (which raises
everyone else's wait, not its own). We compare its median over the newest `fabric_steps`
steps with the oldest `fabric_steps` steps of the window.

Why it holds under noise: both sides are medians over 20 steps, so a single slow
collective (a retransmit, a congested link for one step) moves the median by one place and
raises nothing, while a fabric that really got slower moves most steps. A spike on one
rank (a GC pause) lengthens everyone else's wait but not the spiking rank's own, so the
step's smallest wait is untouched by it. Per-rank compute jitter averages out in the
compute medians, and the "compute unchanged" guard widens to four standard errors of the
drift when the steps' own spread says jitter alone moves it more than the configured 5%
(with CV 30% per rank a fixed 5% missed about one fabric fault in five).
"""

from __future__ import annotations

from math import sqrt
from typing import Literal, cast

from detectors.common import (
    by_step,
    comms_of,
    computes_of,
    median,
    per_step,
    rank_nodes,
    run_subject,
    step_times,
)
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, Finding, RunWindow, StepRow


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """`fabric` findings of every run of the window (see `detect_run`)."""
    return [f for run in window.runs for f in detect_run(run, now, config)]


# (collective time, median compute, the comm_waits, median step_time) of one step; the
# comm_waits' median is taken only for a finding's evidence (most windows raise none).
Profile = tuple[float, float, list[float], float]


def _kept_profile(rows: list[StepRow], step_time: float) -> Profile | None:
    return per_step("fabric", rows, lambda: _profile(rows, step_time))


def _profile(rows: list[StepRow], step_time: float) -> Profile | None:
    """The step's profile (see `Profile`), given its median step_time."""
    comms, computes = comms_of(rows), computes_of(rows)
    if None in comms:
        comms = [c for c in comms if c is not None]
    if None in computes:
        computes = [c for c in computes if c is not None]
    if not comms or not computes:
        return None
    known_comms, known_computes = cast(list[float], comms), cast(list[float], computes)
    return min(known_comms), median(known_computes), known_comms, step_time


def _noise(
    early: list[Profile], late: list[Profile], base: float, field: Literal[0, 1] = 1
) -> float:
    """Four standard errors of the drift of one profile field (compute by default), relative
    to `base`: what jitter alone moves the two medians by (each median's error ≈ 1.25 × the
    steps' robust spread / √n, the spread from the median absolute deviation)."""

    def error(profiles: list[Profile]) -> float:
        values = [p[field] for p in profiles]
        middle = median(values)
        spread = 1.4826 * median([abs(v - middle) for v in values])
        return 1.2533 * spread / sqrt(len(values))

    return 4 * sqrt(error(early) ** 2 + error(late) ** 2) / base


def detect_run(
    run: RunWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """One warning (`run:<run>`) when the collective time rose by `fabric_rise` or more
    while the median compute stayed within `fabric_compute_tolerance` (or what jitter
    alone moves it by, when that is more); evidence: both
    medians before and now, and the GPU-hours per hour the run loses."""
    steps, times = by_step(run.steps), step_times(run.steps)
    numbers = sorted(steps)
    n = config.fabric_steps
    if len(numbers) < 2 * n:
        return []
    early = [p for s in numbers[:n] if (p := _kept_profile(steps[s], times[s]))]
    late = [p for s in numbers[-n:] if (p := _kept_profile(steps[s], times[s]))]
    if not early or not late:
        return []
    base_comm, now_comm = median([p[0] for p in early]), median([p[0] for p in late])
    base_compute, now_compute = median([p[1] for p in early]), median([p[1] for p in late])
    if base_comm <= 0 or base_compute <= 0:
        return []
    rise = now_comm / base_comm - 1.0
    drift = now_compute / base_compute - 1.0
    tolerance = max(config.fabric_compute_tolerance, _noise(early, late, base_compute))
    # The collective's own jitter sets the bar too: on a busy host a few-ms collective swings
    # by half between windows with nothing wrong (a real DDP job on 2 shared cores did).
    needed = max(config.fabric_rise, _noise(early, late, base_comm, field=0))
    if rise < needed or abs(drift) > tolerance:
        return []
    step_time = median([p[3] for p in late])
    world = run.world_size or len(rank_nodes(run))
    return [
        Finding(
            kind="fabric",
            subject=run_subject(run.run),
            severity="warning",
            summary=(
                f"{run.run}'s collectives take {now_comm / base_comm:.1f}× as long as at steps "
                f"{numbers[0]}–{numbers[n - 1]} ({now_comm:.3f} s vs {base_comm:.3f} s per step) "
                f"while compute is unchanged: the interconnect, not a rank, is slow"
            ),
            run=run.run,
            evidence={
                "baseline_collective_s": round(base_comm, 6),
                "collective_s": round(now_comm, 6),
                "rise": round(rise, 4),
                "baseline_compute_s": round(base_compute, 6),
                "compute_s": round(now_compute, 6),
                "compute_drift": round(drift, 4),
                "compute_tolerance": round(tolerance, 4),
                "rise_needed": round(needed, 4),
                "median_comm_wait_s": round(median([median(p[2]) for p in late]), 6),
                "baseline_steps": [numbers[0], numbers[n - 1]],
                "steps": [numbers[-n], numbers[-1]],
                "gpu_hours_lost_per_hour": round(world * (now_comm - base_comm) / step_time, 3)
                if step_time > 0
                else None,
            },
            since=min(r.ts for r in steps[numbers[-n]]),
        )
    ]
