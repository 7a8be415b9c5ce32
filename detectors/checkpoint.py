"""Checkpoints: how much work a failure would throw away, and uploads that did not land.

`checkpoint_stale`: too long since the last checkpoint that reached durable storage.
`checkpoint_upload`: a local checkpoint whose durable copy failed, or did not complete
within `checkpoint_upload_s`.

Why they hold under noise: both are decided from checkpoint events and the clock, not from
per-step timings or telemetry samples, so step jitter and spikes cannot move them. A
duplicated or late event changes nothing: staleness counts from the newest durable
completion, and an upload is judged by whether its durable copy completed or failed.
"""

from __future__ import annotations

from typing import Any

from detectors.common import rank_nodes, run_subject
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.types import ClusterWindow, EventRow, Finding, RunWindow


def _checkpoints(run: RunWindow, tier: str, state: str) -> list[EventRow]:
    return sorted(
        (
            e
            for e in run.events
            if e.kind == "checkpoint"
            and e.data.get("tier") == tier
            and e.data.get("state") == state
        ),
        key=lambda e: e.ts,
    )


def checkpoint_status(run: RunWindow, now: float) -> dict[str, Any]:
    """The run's newest completed checkpoint per tier ({"step", "at"} or None) and the work
    at risk: GPU-hours since the newest durable one (or since the run started; the first
    step seen when the start is unknown). The contract's run summary `checkpoint`."""
    out: dict[str, Any] = {}
    for tier in ("local", "durable"):
        done = _checkpoints(run, tier, "completed")
        out[tier] = {"step": done[-1].step, "at": done[-1].ts} if done else None
    if out["durable"]:
        since: float | None = out["durable"]["at"]
    elif run.started_at is not None:
        since = run.started_at
    else:
        since = min((r.ts - r.step_time for r in run.steps), default=None)
    world = run.world_size or len(rank_nodes(run))
    out["since"] = since
    out["work_at_risk_gpu_hours"] = (
        round(world * max(0.0, now - since) / 3600, 3) if since is not None else None
    )
    return out


def detect(
    window: ClusterWindow, now: float, config: DetectorConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """Per run (`run:<run>`): `checkpoint_stale` past `checkpoint_stale_s` (critical at
    twice that), `checkpoint_upload` for a failed (critical) or overdue (warning) upload."""
    findings = []
    for run in window.runs:
        findings += _stale(run, now, config)
        findings += _upload(run, now, config)
    return findings


def _stale(run: RunWindow, now: float, config: DetectorConfig) -> list[Finding]:
    status = checkpoint_status(run, now)
    since = status["since"]
    if since is None or now - since <= config.checkpoint_stale_s:
        return []
    age = now - since
    durable = status["durable"]
    last_step = max((r.step for r in run.steps), default=None)
    steps_since = last_step - durable["step"] if durable and last_step is not None else None
    what = f"since step {durable['step']}" if durable else "since the run started"
    return [
        Finding(
            kind="checkpoint_stale",
            subject=run_subject(run.run),
            severity="critical" if age >= 2 * config.checkpoint_stale_s else "warning",
            summary=(
                f"{run.run} has no durable checkpoint for {age / 60:.0f} min ({what}): a "
                f"failure now would throw away {status['work_at_risk_gpu_hours']:.1f} GPU-hours"
            ),
            run=run.run,
            evidence={
                "durable_step": durable["step"] if durable else None,
                "durable_at": durable["at"] if durable else None,
                "age_s": round(age, 1),
                "steps_since": steps_since,
                "limit_s": config.checkpoint_stale_s,
                "work_at_risk_gpu_hours": status["work_at_risk_gpu_hours"],
            },
            since=since + config.checkpoint_stale_s,
        )
    ]


def _upload(run: RunWindow, now: float, config: DetectorConfig) -> list[Finding]:
    durable_done = {e.step for e in _checkpoints(run, "durable", "completed")}
    newest_ok = max((s for s in durable_done if s is not None), default=None)
    failed = {e.step: e for e in _checkpoints(run, "durable", "failed")}
    problems: list[tuple[EventRow, str, float]] = []
    for local in _checkpoints(run, "local", "completed"):
        # Once a newer checkpoint is durable, older failed uploads no longer matter.
        if local.step in durable_done or (
            newest_ok is not None and local.step is not None and local.step <= newest_ok
        ):
            continue
        if local.step in failed:
            problems.append((local, "failed", failed[local.step].ts - local.ts))
        elif now - local.ts > config.checkpoint_upload_s:
            problems.append((local, "overdue", now - local.ts))
    if not problems:
        return []
    local, state, waited = problems[-1]
    if state == "failed":
        summary = f"the durable upload of {run.run}'s step-{local.step} checkpoint failed"
    else:
        summary = (
            f"the durable upload of {run.run}'s step-{local.step} checkpoint has not completed "
            f"{waited / 60:.0f} min after the local save"
        )
    if len(problems) > 1:
        summary += f" ({len(problems)} checkpoints not durable)"
    return [
        Finding(
            kind="checkpoint_upload",
            subject=run_subject(run.run),
            severity="critical" if state == "failed" else "warning",
            summary=summary,
            run=run.run,
            evidence={
                "step": local.step,
                "state": state,
                "local_completed_at": local.ts,
                "waited_s": round(waited, 1),
                "limit_s": config.checkpoint_upload_s,
                "path": local.data.get("path"),
                "pending": [{"step": e.step, "state": s} for e, s, _ in problems],
                "newest_durable_step": newest_ok,
            },
            since=problems[0][0].ts,
        )
    ]
