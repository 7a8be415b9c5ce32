"""Hang: a run's step counter stopped while its nodes still report.

The limit is max(`hang_factor` × the run's median step time, `hang_min_s`). A checkpoint
that started after the last step and has not finished excuses the stall (training is busy
saving) until `checkpoint_timeout_s`, after which the hang is reported anyway. When every
node of the run is silent the heartbeat detector speaks instead.

Why it holds under noise: the typical step time is a median over the newest 20 steps, so
one 5× (or 9×) slower step neither raises a hang nor stretches the limit, and the limit is
at least `hang_min_s` (120 s) and ten typical steps, far beyond per-step jitter and the
2–5× spikes of GC pauses or pre-emption. Only a step counter that stops for that long is a
hang; a run that keeps stepping, however unevenly, is not.
"""

from __future__ import annotations

from functools import partial
from operator import attrgetter

from detectors.common import (
    by_step,
    median,
    per_step,
    rank_nodes,
    run_subject,
    step_times,
    unique_events,
)
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.heartbeat import is_silent
from detectors.types import ClusterWindow, EventRow, Finding, RunWindow, StepRow

_TS = attrgetter("ts")


def typical_step_time(run: RunWindow, last: int = 20) -> float | None:
    """The median over the newest `last` steps of each step's median step_time."""
    times = step_times(run.steps)
    recent = sorted(times)[-last:]
    if not recent:
        return None
    return median([times[n] for n in recent])


def blocking_checkpoint(run: RunWindow, after: float) -> EventRow | None:
    """The oldest checkpoint `started` at or after `after` with no completed/failed yet: a
    save that began once training stopped stepping (an upload started earlier runs in the
    background and excuses nothing)."""
    ended = {
        (e.step, e.data.get("tier"))
        for e in run.events
        if e.kind == "checkpoint" and e.data.get("state") in ("completed", "failed")
    }
    open_ = [
        e
        for e in run.events
        if e.kind == "checkpoint"
        and e.data.get("state") == "started"
        and (e.step, e.data.get("tier")) not in ended
        and e.ts >= after
    ]
    return min(open_, key=lambda e: e.ts) if open_ else None


def _last_ts(rows: list[StepRow]) -> float:
    return max(map(_TS, rows))


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """One critical finding (`run:<run>`) per stalled run; evidence: last step and when,
    the stall and its limit, silent nodes, an overdue checkpoint, GPU-hours idled."""
    seen = {n.node: n for n in window.nodes}
    crashes = [(run, e) for kind in ("oom", "error") for run, e in unique_events(window, kind)]
    findings = []
    for run in window.runs:
        typical = typical_step_time(run)
        if typical is None:
            continue  # never stepped in the window: nothing to measure a stall from
        last_at = max(
            per_step("last_ts", rows, partial(_last_ts, rows))
            for rows in by_step(run.steps).values()
        )
        limit = max(config.hang_factor * typical, config.hang_min_s)
        stalled = now - last_at
        if stalled <= limit:
            continue
        known = [seen[n] for n in set(rank_nodes(run).values()) if n in seen]
        silent = sorted(n.node for n in known if is_silent(n, now, config))
        if known and len(silent) == len(known):
            continue  # nobody reports: the heartbeat detector says so
        ckpt = blocking_checkpoint(run, last_at - typical)
        if ckpt is not None and now - ckpt.ts <= config.checkpoint_timeout_s:
            continue
        last_step = max(step_times(run.steps))  # the step numbers the rows name
        world = run.world_size or len(rank_nodes(run))
        why = ""
        if silent:
            why = f"; {', '.join(silent)} went silent"
        elif ckpt is not None:
            why = f"; the step-{ckpt.step} checkpoint started {now - ckpt.ts:.0f} s ago"
        crash = [e for r, e in crashes if r == run.run and e.ts >= last_at - typical]
        if crash:
            who = f"rank {crash[0].rank}" if crash[0].rank is not None else crash[0].node
            why += f"; {who} reported {crash[0].kind} at {crash[0].ts:.0f}"
        findings.append(
            Finding(
                kind="hang",
                subject=run_subject(run.run),
                severity="critical",
                summary=(
                    f"{run.run} has not finished a step since step {last_step}, {stalled:.0f} s "
                    f"ago ({stalled / typical:.0f}× its {typical:.2f} s median step){why}"
                ),
                run=run.run,
                evidence={
                    "last_step": last_step,
                    "last_step_at": last_at,
                    "stalled_s": round(stalled, 1),
                    "limit_s": round(limit, 1),
                    "median_step_time": round(typical, 4),
                    "silent_nodes": silent,
                    "checkpoint_step": ckpt.step if ckpt is not None else None,
                    "crash": [e.kind for e in crash],
                    "gpu_hours_idle": round(world * stalled / 3600, 3),
                },
                since=last_at,
            )
        )
    return findings
