"""Reads for the dashboard pages: time ranges, tile health, checksum agreement, events.

Every function here runs a fixed number of queries whatever the number of nodes or ranks."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from apps.alerts.choices import OPEN_STATES
from apps.alerts.models import Alert
from apps.clusters.choices import NodeState
from apps.clusters.models import Cluster, Node
from apps.core.bounds import MAX_GPUS
from apps.history.selectors import run_rank_history
from apps.ingest.models import InboxBatch
from apps.runs.choices import ENDED_STATES, RunState
from apps.runs.models import CHECKED, Run, RunEvent, StepReport
from detectors.config import DEFAULT_CONFIG
from detectors.sdc import minority_canary, minority_exact
from detectors.types import StepRow

# The range picker: key → seconds back from the end; "all" is the whole run (or, for a
# node, the contract's 7 days of history).
RANGES: dict[str, int | None] = {"15m": 900, "1h": 3600, "6h": 21_600, "24h": 86_400, "all": None}
NODE_HISTORY_S = 7 * 86_400
FUTURE_SLACK_S = 300  # the contract accepts ts up to 5 minutes ahead
# Tile colours, worst last; "cordoned" and "nodata" are states of their own, not severities.
TILE_ORDER = ("ok", "warning", "critical", "down")
TILE_STATES = ("ok", "warning", "critical", "down", "cordoned", "nodata")
# Thresholds of a GPU tile's own colour (alerts can only make it worse). The page's JS
# applies the same rules to live deltas, with these values handed over by json_script.
HEALTH_RULES = {
    "temp_warning_c": 80.0,
    "temp_critical_c": 85.0,
    "mem_warning_ratio": 0.95,
    # NVML clocks-event reasons: HW slowdown, SW thermal, HW thermal, HW power brake
    "throttle_warning_mask": 0x08 | 0x20 | 0x40 | 0x80,
    # a node silent this long is down (the heartbeat alert says so too, a little later)
    "silent_down_s": max(90.0, 3 * DEFAULT_CONFIG.heartbeat_min_s),
}
OVERVIEW_ALERTS = 10
PAGE_ALERTS = 50
ALERTS_PAGE_LIMIT = 200
CHECKED_STEPS_MAX = 200
NODE_EVENTS_MAX = 200
NODE_EVENT_KINDS = ("xid", "ecc")


@dataclass(frozen=True)
class TimeRange:
    key: str
    start: float
    end: float


class RangeInvalid(ValueError):
    pass


def time_range(*, key: str, now: float, began: float | None = None) -> TimeRange:
    """The picker's range up to now; "all" starts when the run `began` (run_began; a node's
    "all": NODE_HISTORY_S ago). The
    end reaches FUTURE_SLACK_S past now, as the contract accepts: an agent whose clock runs a
    little ahead must not have its newest points hidden."""
    if key not in RANGES:
        raise RangeInvalid(f"must be one of {', '.join(RANGES)}")
    seconds = RANGES[key]
    end = now + FUTURE_SLACK_S
    if seconds is not None:
        return TimeRange(key, now - seconds, end)
    start = began if began is not None else now - NODE_HISTORY_S
    return TimeRange(key, min(start, now - 60), end)


def run_began(run: Run) -> float:
    """When the run began: its creation, or its first step report when an agent delivered
    older reports (a spooled backlog) than that. One query on the (run, step) index."""
    first = StepReport.objects.filter(run=run).order_by("step").values_list("ts", flat=True)[:1]
    began = run.created_at.timestamp()
    return min([began, *(ts.timestamp() for ts in first)])


def cluster_of(*, name: str) -> Cluster | None:
    return Cluster.objects.filter(name=name).first()


def run_of(*, cluster: Cluster, name: str) -> Run | None:
    return Run.objects.filter(cluster=cluster, name=name).first()


def node_of(*, cluster: Cluster, name: str) -> Node | None:
    """The node, with `quarantined_batches`: how many of its batches the worker could not
    store and set aside (apps.ingest: they count in the node's health)."""
    quarantined = (
        InboxBatch.objects.filter(
            token__cluster_id=OuterRef("cluster_id"),
            node=OuterRef("name"),
            quarantined_at__isnull=False,
        )
        .order_by()
        .values("node")
        .annotate(count=Count("id"))
        .values("count")
    )
    return (
        Node.objects.filter(cluster=cluster, name=name)
        .annotate(quarantined_batches=Coalesce(Subquery(quarantined), 0))
        .first()
    )


def running_runs(*, cluster: Cluster, now: float) -> list[Run]:
    """Runs in state running that stepped within the alerts' idle limit (or just began)."""
    recent = datetime.fromtimestamp(now - settings.ALERT_IDLE_S, UTC)
    return list(
        Run.objects.filter(cluster=cluster, state=RunState.RUNNING)
        .filter(Q(last_step_at__gte=recent) | Q(last_step_at__isnull=True, created_at__gte=recent))
        .order_by("name")
    )


def ended_runs(*, cluster: Cluster, now: float) -> list[Run]:
    """Runs that ended (run_end: finished or failed) within the alerts' idle limit, newest
    end first: the overview lists them apart from the running ones."""
    recent = datetime.fromtimestamp(now - settings.ALERT_IDLE_S, UTC)
    return list(
        Run.objects.filter(cluster=cluster, state__in=ENDED_STATES, ended_at__gte=recent).order_by(
            "-ended_at", "name"
        )
    )


def open_alerts(*, cluster: Cluster) -> list[Alert]:
    return list(
        Alert.objects.filter(cluster=cluster, state__in=OPEN_STATES)
        .select_related("cluster", "run", "node", "acknowledged_by")
        .order_by("-opened_at", "-id")
    )


def alerts_filtered(
    *,
    cluster: Cluster | None = None,
    kind: str = "",
    state: str = "",
    run: str = "",
    node: str = "",
    limit: int = ALERTS_PAGE_LIMIT,
    visible: list[Cluster] | None = None,
) -> list[Alert]:
    """Alerts newest first, narrowed by any of the given filters (empty: no filter), of the
    `visible` clusters only when given."""
    alerts = Alert.objects.select_related("cluster", "run", "node", "acknowledged_by")
    if visible is not None:
        alerts = alerts.filter(cluster__in=visible)
    if cluster is not None:
        alerts = alerts.filter(cluster=cluster)
    for field, value in (("kind", kind), ("state", state), ("run__name", run)):
        if value:
            alerts = alerts.filter(**{field: value})
    if node:
        alerts = alerts.filter(node__name=node)
    return list(alerts.order_by("-opened_at", "-id")[:limit])


def alert_kinds() -> list[str]:
    return sorted(Alert.objects.values_list("kind", flat=True).distinct())


def gpu_health(values: dict[str, Any]) -> str:
    """A GPU's own colour from its latest values (HEALTH_RULES)."""
    temp = values.get("gpu.temp_c")
    if temp is not None and temp >= HEALTH_RULES["temp_critical_c"]:
        return "critical"
    if temp is not None and temp >= HEALTH_RULES["temp_warning_c"]:
        return "warning"
    used, total = values.get("gpu.mem_used_bytes"), values.get("gpu.mem_total_bytes")
    if used is not None and total and used / total >= HEALTH_RULES["mem_warning_ratio"]:
        return "warning"
    throttle = values.get("gpu.throttle_reasons")
    if throttle is not None and int(throttle) & HEALTH_RULES["throttle_warning_mask"]:
        return "warning"
    return "ok"


def _worse(a: str, b: str) -> str:
    return a if TILE_ORDER.index(a) >= TILE_ORDER.index(b) else b


def node_gpu_count(node: dict[str, Any]) -> int:
    """How many GPUs a node (node_health_list's shape) has: node_info.gpus, or more where it
    reported a higher GPU index. Not capped: rows stored before ingest bounded both can claim
    millions, which is why the pages draw at most MAX_GPUS tiles."""
    claimed = node["gpus"] if type(node["gpus"]) is int else 0  # JSON: any type may be there
    indexes = [int(key) for key in node["health"] if key.isdigit()]  # "host" is not a GPU
    return max([claimed, *(gpu + 1 for gpu in indexes)])


def node_tiles(
    *, node: dict[str, Any], alerts: list[dict[str, Any]], now: float
) -> list[dict[str, Any]]:
    """One tile per GPU of a node (node_health_list's shape; the first MAX_GPUS of them)
    with its state: down (node down, silent, or a heartbeat alert), cordoned (cordoned or
    draining), nodata (no GPU reading), else the worse of the GPU's own health and its open
    alerts' severity (alerts on the node without a GPU count for every GPU)."""
    mine = [a for a in alerts if a["node"] == node["node"] and a["state"] in OPEN_STATES]
    silent = node["last_seen"] is None or now - node["last_seen"] > HEALTH_RULES["silent_down_s"]
    down = node["state"] == NodeState.DOWN or silent or any(a["kind"] == "heartbeat" for a in mine)
    cordoned = node["state"] in (NodeState.CORDONED, NodeState.DRAINING)
    tiles = []
    for gpu in range(min(node_gpu_count(node), MAX_GPUS)):
        values = node["health"].get(str(gpu))
        if down:
            state = "down"
        elif cordoned:
            state = "cordoned"
        elif values is None:
            state = "nodata"
        else:
            state = gpu_health(values)
            for alert in mine:
                if alert["gpu"] in (None, gpu):
                    state = _worse(state, alert["severity"])
        tiles.append({"gpu": gpu, "state": state, "values": values or {}})
    return tiles


def checksum_agreement(
    *, run: Run, start: float, end: float, limit: int = CHECKED_STEPS_MAX
) -> list[dict[str, Any]]:
    """Per checked step (newest `limit` in the range, oldest first): how many ranks reported a
    check and which disagreed with their shard's majority — by gradient checksum, parameter
    checksum or canary (the rules of detectors.sdc, so the page names the ranks an alert
    names). One query."""
    rows = list(
        StepReport.objects.filter(
            run=run,
            ts__gte=datetime.fromtimestamp(start, UTC),
            ts__lt=datetime.fromtimestamp(end, UTC),
        )
        .filter(CHECKED)  # the partial index stepreport_run_checked
        .order_by("-step", "rank")
        .values_list(
            "step",
            "ts",
            "rank",
            "shard",
            "grad_checksum",
            "param_checksum",
            "canary_norm",
            "canary_proj",
        )[: limit * max(run.world_size, 1)]
    )
    groups: dict[int, dict[str | None, dict[int, StepRow]]] = defaultdict(lambda: defaultdict(dict))
    times: dict[int, float] = {}
    for step, ts, rank, shard, grad, param, norm, proj in rows:
        groups[step][shard][rank] = StepRow(
            node="", rank=rank, step=step, ts=ts.timestamp(), step_time=0.0,
            grad_checksum=grad, param_checksum=param, canary_norm=norm,
            canary_proj=tuple(proj) if proj else None, shard=shard,
        )  # fmt: skip
        times[step] = max(times.get(step, 0.0), ts.timestamp())
    return [_step_agreement(step, times[step], groups[step]) for step in sorted(groups)[-limit:]]


def _step_agreement(step: int, ts: float, shards: dict[str | None, dict[int, StepRow]]) -> dict:
    rtol = DEFAULT_CONFIG.sdc_canary_rtol
    out: dict[str, Any] = {
        "step": step,
        "ts": ts,
        "ranks": 0,
        "grad": [],
        "param": [],
        "canary": [],
    }
    for rows in shards.values():
        out["ranks"] += len(rows)
        out["grad"] += minority_exact({r: row.grad_checksum for r, row in rows.items()})[0]
        out["param"] += minority_exact({r: row.param_checksum for r, row in rows.items()})[0]
        out["canary"] += minority_canary(rows, rtol)[0]
    out["shards"] = sorted(s or "" for s in shards)
    for check in ("grad", "param", "canary"):
        out[check] = sorted(out[check])
    return out


def checkpoint_events(*, run: Run, start: float, end: float) -> list[dict[str, Any]]:
    """The run's checkpoint events in the range, oldest first, with the contract's fields."""
    events = RunEvent.objects.filter(
        run=run,
        kind="checkpoint",
        ts__gte=datetime.fromtimestamp(start, UTC),
        ts__lt=datetime.fromtimestamp(end, UTC),
    ).order_by("ts", "id")
    return [
        {
            "ts": event.ts.timestamp(),
            "step": event.step,
            "tier": event.data.get("tier"),
            "state": event.data.get("state"),
            "path": event.data.get("path"),
            "bytes": event.data.get("bytes"),
            "duration": event.data.get("duration"),
        }
        for event in events
    ]


def node_events(*, node: Node, limit: int = NODE_EVENTS_MAX) -> list[dict[str, Any]]:
    """The node's newest XID and ECC events."""
    events = RunEvent.objects.filter(node=node, kind__in=NODE_EVENT_KINDS).order_by("-ts", "-id")
    return [
        {
            "ts": event.ts.timestamp(),
            "at": event.ts,
            "kind": event.kind,
            "gpu": event.gpu,
            "code": event.data.get("code"),
            "count": event.data.get("count"),
            "message": event.data.get("message", ""),
        }
        for event in events[:limit]
    ]


def run_span(*, run: Run, tr: TimeRange, began: float) -> tuple[float, float]:
    """The part of the range in which the run has steps (from `began`, its first report, to
    its last step), so that the step charts of a short run get a fine resolution."""
    last = run.last_step_at.timestamp() + 1 if run.last_step_at else tr.end
    start, end = max(tr.start, began), min(tr.end, last)
    return (start, end) if start < end else (tr.start, tr.end)


def rank_busy_history(
    *, run: Run, start: float, end: float, max_points: int = 120
) -> dict[str, Any]:
    """Per rank and time bucket: the mean step time less collective wait (the rank's own
    work). In synchronous training every rank's step_time is the same — the fast ranks wait
    in the all-reduce for the slow one — so it is this time, not step_time, in which a
    straggler stands out. From apps.history (rollups, raw data after the last pass): {"ts":
    bucket starts, "ranks": [...], "z": rank × bucket (None where a rank reported nothing),
    "resolution_s"}, without the buckets where no rank reported."""
    history = run_rank_history(run_id=run.id, start=start, end=end, max_points=max_points)
    used = [i for i in range(len(history.ts)) if any(row[i] is not None for row in history.busy)]
    z = [[_rounded(row[i]) for i in used] for row in history.busy]
    return {
        "ts": [history.ts[i] for i in used],
        "ranks": history.ranks,
        "z": z,
        "resolution_s": history.resolution_s,
    }


def _rounded(value: Any) -> float | None:
    """A mean to 6 places; None where there is none or it is not a finite number (Postgres's
    json writes a non-finite one as the string "Infinity" or "NaN")."""
    if isinstance(value, int | float) and math.isfinite(value):
        return round(value, 6)
    return None
