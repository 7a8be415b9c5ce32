from __future__ import annotations

import time
from typing import Any

from django.db import connection

from apps.alerts.selectors import run_goodput
from apps.runs.models import Run, RunEvent

THROUGHPUT_WINDOW_S = 60
NODES_STEPS = 10


def run_get(*, name: str, **cluster_filter: Any) -> Run | None:
    runs = list(Run.objects.filter(name=name, **cluster_filter)[:2])
    return runs[0] if len(runs) == 1 else None


def run_summary(*, run: Run, now: float | None = None) -> dict[str, Any]:
    """The contract's run summary; goodput over the detectors' window of the run."""
    now = time.time() if now is None else now
    checkpoint = {tier: _last_checkpoint(run, tier) for tier in ("local", "durable")}
    durable_at = checkpoint["durable"]["at"] if checkpoint["durable"] else None
    since = durable_at or run.created_at.timestamp()
    return {
        "run": run.name,
        "state": run.state,
        "ranks": run.world_size,
        "last_step": run.last_step,
        "last_step_at": run.last_step_at.timestamp() if run.last_step_at else None,
        "tokens_per_s": _tokens_per_s(run),
        "goodput": run_goodput(run=run, now=now),
        "checkpoint": {
            **checkpoint,
            # GPU-hours that a failure now would throw away: one GPU per rank since the
            # newest durable checkpoint (or since the run started).
            "work_at_risk_gpu_hours": round(run.world_size * max(0.0, now - since) / 3600, 4),
        },
        "nodes": _nodes(run),
    }


def _last_checkpoint(run: Run, tier: str) -> dict[str, Any] | None:
    event = (
        RunEvent.objects.filter(
            run=run, kind="checkpoint", data__tier=tier, data__state="completed"
        )
        .order_by("-ts")
        .only("step", "ts")
        .first()
    )
    return {"step": event.step, "at": event.ts.timestamp()} if event else None


def _tokens_per_s(run: Run) -> float | None:
    if run.last_step_at is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(tokens), extract(epoch FROM max(ts) - min(ts))::float8,"
            " count(DISTINCT step) FROM runs_stepreport"
            " WHERE run_id = %s AND ts > %s - make_interval(secs => %s)",
            [run.id, run.last_step_at, THROUGHPUT_WINDOW_S],
        )
        tokens, span, steps = cursor.fetchone()
    if not tokens or not span or steps < 2:
        return None
    # tokens of the first step in the window were processed before it started
    return round(float(tokens) * (steps - 1) / steps / span, 3)


def _nodes(run: Run) -> list[str]:
    """The nodes the run's ranks reported from over its last NODES_STEPS steps (where it runs
    now; a (run_id, step) index range: 2.5 k reports at 256 ranks)."""
    if run.last_step is None:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT n.name FROM runs_stepreport s JOIN clusters_node n ON n.id = s.node_id"
            " WHERE s.run_id = %s AND s.step > %s ORDER BY n.name",
            [run.id, run.last_step - NODES_STEPS],
        )
        return [row[0] for row in cursor.fetchall()]
