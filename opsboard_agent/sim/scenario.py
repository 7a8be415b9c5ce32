"""The scenario file: what was simulated and injected, for scoring detectors against.

Everything in it follows from the command line (seed, layout, faults, timing) except
`base_ts`, the single wall-clock anchor: simulated second `t` is Unix time `base_ts + t`,
and each fault's `start_ts` is `base_ts + at`. Two runs with the same arguments write the
same file apart from those.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from opsboard_agent.sim.model import ClusterModel

VERSION = 1


def scenario_build(
    model: ClusterModel, *, base_ts: float, duration: float, speed: float
) -> dict[str, Any]:
    """The scenario as plain JSON data. `halts` says when and why a run stops stepping
    (hang, loss of one of its nodes, OOM) where that happens within `duration`."""
    config = model.config
    halts = {
        run: {"ts": base_ts + t, "at": t, "reason": reason}
        for run, (t, reason) in model.halt.items()
        if math.isfinite(t) and t <= duration
    }
    faults = []
    for fault in model.faults:
        entry: dict[str, Any] = {
            "fault": fault.kind,
            "subject": fault.subject(),
            "start_ts": base_ts + fault.at,
            "at": fault.at,
            "params": dict(fault.params),
        }
        resume = next((r for r in model.resumes.get(fault.run or "", ()) if r.at == fault.at), None)
        if fault.kind == "resume" and resume is not None:
            # what the server should make of it: a restart, and the lost steps' wall time
            # (the old timeline's steps from the resumed step on) booked as recovery
            entry.update(
                restart_ts=base_ts + resume.restart_t,
                crash_step=resume.crash_step,
                checkpoint_step=resume.checkpoint_step,
                resume_step=resume.resume_step,
                lost_s=round(resume.lost_to - resume.lost_from, 3),
            )
        if fault.kind == "oom-creep":
            oom_at = fault.at + fault.param("ramp")
            if model.halt[fault.run or ""] == (oom_at, "oom") and oom_at <= duration:
                entry["oom_ts"] = base_ts + oom_at
        faults.append(entry)
    return {
        "version": VERSION,
        "seed": config.seed,
        "base_ts": base_ts,
        "end_ts": base_ts + duration,
        "duration": duration,
        "speed": speed,
        "step_time": config.step_time,
        "interval": config.interval,
        "check_every": config.check_every,
        "checkpoint_every": config.checkpoint_every,
        "tokens_per_step": config.tokens_per_step,
        "noise": {"cv": config.noise.cv, "spike_rate": config.noise.spike_rate},
        "layout": model.layout.to_dict(),
        "faults": faults,
        "halts": halts,
    }


def scenario_write(scenario: dict[str, Any], path: str | Path) -> None:
    """Write atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(scenario, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
