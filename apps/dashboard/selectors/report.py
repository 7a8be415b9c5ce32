"""A run's reliability report (docs/operations.md, "The run's reliability report"): its
goodput and badput, its interruptions by root cause with the work each lost since its last
durable checkpoint, its checkpoint cadence against the optimum for the failure rate it saw
(Young/Daly), and the nodes that cost it most. Read on demand, while it runs or once it
ended (an ended run's report no longer changes); the page, its JSON and Markdown exports and
`GET /api/v1/runs/NAME/report` all give this one dict.

- An interruption is a restart as goodput counts them (detectors.goodput.restarts_of: the
  `restart` events, and the restart the step counter going back implies). Its cause is the
  alert the ledger lays it at (selectors.ledger.RESTART_CAUSE), or none ("unattributed").
- Work lost: from the newest durable checkpoint completed before the restart (else the
  run's start) to the restart, on every rank's GPU: `ranks × lost_s / 3600` GPU-hours.
- Incidents by root cause: the run's incidents (those with an alert of the run), grouped
  by their root's kind ("unknown" where the root is), with the GPU-hours each lost so far
  (selectors.incidents.incident_gpu_hours_lost: the incident page's and API's figure).
- Young/Daly: with δ the median blocking save (a local save's start to end) and M the mean
  time between interruptions (the run's wall time over their count), the interval that
  loses least is τ = √(2δM) − δ (Daly's first-order form); none without an interruption.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from typing import Any

from django.db import connections

from apps.alerts.selectors.incidents import (
    incident_gpu_hours_lost,
    incident_list,
    incident_members,
)
from apps.core.db_router import read_alias
from apps.core.times import to_datetime, to_seconds
from apps.dashboard.selectors.ledger import RESTART_CAUSE, RESTART_CAUSE_S
from apps.runs.models import Run, RunEvent
from apps.runs.selectors import run_summary
from detectors.goodput import checkpoint_saves, restarts_of
from detectors.types import EventRow
from detectors.xid import xid_info

UNATTRIBUTED = "unattributed"

_CAUSES_SQL = f"""
SELECT e.ts, cause.id, cause.kind, n.name, cause.gpu, cause.summary,
       CASE WHEN jsonb_typeof(cause.evidence -> 'code') = 'number'
            THEN (cause.evidence ->> 'code')::numeric::bigint END
FROM (SELECT %(run)s::bigint AS run_id, ts FROM unnest(%(ts)s::timestamptz[]) AS t(ts)) e
LEFT JOIN LATERAL ({RESTART_CAUSE}) cause ON true
LEFT JOIN clusters_node n ON n.id = cause.node_id
ORDER BY e.ts
"""


def run_report(*, run: Run, now: float | None = None) -> dict[str, Any]:
    """The run's reliability report as plain JSON (see the module docstring)."""
    now = time.time() if now is None else now
    summary = run_summary(run=run, now=now)
    events = [
        EventRow(ts=e.ts.timestamp(), kind=e.kind, node="", step=e.step, data=e.data)
        for e in RunEvent.objects.using(read_alias())
        .filter(run=run, kind__in=("restart", "checkpoint"))
        .order_by("ts", "id")
    ]
    started = run.created_at.timestamp()
    end = now if run.state == "running" else (to_seconds(run.last_step_at) or now)
    restarts = restarts_of(events, to_seconds(run.timeline_after))
    interruptions = _interruptions(run, restarts, events)
    return {
        "run": run.name,
        "cluster": run.cluster.name,
        "state": run.state,
        "generated_at": now,
        "started_at": started,
        "ended_at": None if run.state == "running" else end,
        "wall_s": round(max(0.0, end - started), 3),
        "ranks": run.world_size,
        "goodput": summary["goodput"],
        "interruptions": interruptions,
        "by_cause": _by_cause(interruptions),
        "incidents": _incidents(run),
        "checkpoints": _cadence(events, len(interruptions), started, end),
        "nodes": _nodes(interruptions),
    }


def _interruptions(run: Run, restarts: list[float], events: list[EventRow]) -> list[dict]:
    durable = [
        (e.ts, e.step)
        for e in events
        if e.kind == "checkpoint"
        and e.data.get("tier") == "durable"
        and e.data.get("state") == "completed"
    ]
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            _CAUSES_SQL,
            {"run": run.pk, "ts": [to_datetime(t) for t in restarts], "cause": RESTART_CAUSE_S},
        )
        rows = cursor.fetchall()
    out = []
    for (at, alert, kind, node, gpu, text, code), ts in zip(rows, restarts, strict=True):
        saved = [(t, step) for t, step in durable if t <= ts]
        since = saved[-1] if saved else None
        lost = ts - (since[0] if since else run.created_at.timestamp())
        cause = None
        if alert is not None:
            cause = {"alert": alert, "kind": kind, "node": node, "gpu": gpu, "code": code}
            cause["summary"] = text
        out.append(
            {
                "at": at.timestamp(),
                "cause": cause,
                "checkpoint": {"step": since[1], "at": since[0]} if since else None,
                "lost_s": round(max(0.0, lost), 3),
                "lost_gpu_hours": round(run.world_size * max(0.0, lost) / 3600, 4),
            }
        )
    return out


def cause_label(cause: dict | None) -> str:
    """A root-cause category, as the published accounts tabulate them."""
    if cause is None:
        return UNATTRIBUTED
    if cause["kind"] == "xid" and isinstance(code := cause.get("code"), int):
        return f"xid {code}: {xid_info(code).meaning}"
    return cause["kind"]


def _by_cause(interruptions: list[dict]) -> list[dict]:
    counts: dict[str, list[float]] = defaultdict(list)
    for item in interruptions:
        counts[cause_label(item["cause"])].append(item["lost_gpu_hours"])
    total = len(interruptions)
    rows = [
        {
            "cause": label,
            "interruptions": len(lost),
            "share": round(len(lost) / total, 4),
            "lost_gpu_hours": round(sum(lost), 4),
        }
        for label, lost in counts.items()
    ]
    return sorted(rows, key=lambda row: (-row["interruptions"], row["cause"]))


def _incidents(run: Run) -> list[dict]:
    """The run's incidents by root cause: count, still open, GPU-hours lost, their ids."""
    incidents = incident_list(cluster=run.cluster, run=run.name, limit=None)
    members = incident_members(incident_ids=[i.pk for i in incidents])
    groups: dict[str, list[tuple[int, bool, float]]] = defaultdict(list)
    for incident in incidents:
        lost = incident_gpu_hours_lost(members.get(incident.pk, []))
        groups[incident.root_kind or "unknown"].append(
            (incident.pk, incident.state == "open", lost)
        )
    rows = [
        {
            "root_cause": kind,
            "incidents": len(items),
            "open": sum(is_open for _, is_open, _ in items),
            "gpu_hours_lost": round(sum(lost for *_, lost in items), 4),
            "ids": sorted(pk for pk, *_ in items),
        }
        for kind, items in groups.items()
    ]
    return sorted(
        rows, key=lambda row: (-row["gpu_hours_lost"], -row["incidents"], row["root_cause"])
    )


def _nodes(interruptions: list[dict]) -> list[dict]:
    by_node: dict[str, list[float]] = defaultdict(list)
    for item in interruptions:
        if item["cause"] is not None and item["cause"]["node"]:
            by_node[item["cause"]["node"]].append(item["lost_gpu_hours"])
    rows = [
        {"node": node, "interruptions": len(lost), "lost_gpu_hours": round(sum(lost), 4)}
        for node, lost in by_node.items()
    ]
    return sorted(rows, key=lambda row: (-row["lost_gpu_hours"], row["node"]))


def _cadence(events: list[EventRow], failures: int, start: float, end: float) -> dict:
    """The durable checkpoints' cadence against Young/Daly's optimum (module docstring)."""
    durable = sorted(
        e.ts
        for e in events
        if e.kind == "checkpoint"
        and e.data.get("tier") == "durable"
        and e.data.get("state") == "completed"
    )
    gaps = [b - a for a, b in zip(durable, durable[1:], strict=False)]
    cadence = statistics.median(gaps) if gaps else None
    costs = [b - a for a, b in checkpoint_saves(events, end) if b > a]
    cost = statistics.median(costs) if costs else None
    mtbf = (end - start) / failures if failures else None
    optimal = None
    if cost is not None and mtbf is not None:
        optimal = max(cost, math.sqrt(2 * cost * mtbf) - cost)
    ratio = cadence / optimal if cadence is not None and optimal else None
    return {
        "durable_saves": len(durable),
        "cadence_s": _round(cadence),
        "save_cost_s": _round(cost),
        "mtbf_s": _round(mtbf),
        "optimal_interval_s": _round(optimal),
        "ratio": _round(ratio),
        "advice": _advice(ratio, failures, cost),
    }


def _advice(ratio: float | None, failures: int, cost: float | None) -> str:
    if not failures:
        return "no interruption seen: the failure rate does not bound the cadence yet"
    if cost is None:
        return "no blocking save measured (no local checkpoint events): no optimum to compare"
    if ratio is None:
        return "fewer than two durable checkpoints: no cadence to compare"
    if ratio > 1.5:
        return f"checkpoint more often: every {ratio:.1f}× the optimal interval loses work"
    if ratio < 0.67:
        return f"checkpoint less often: saves at {ratio:.2f}× the optimal interval cost time"
    return "near the optimum"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
