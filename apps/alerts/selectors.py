"""Reads for alerting: the detectors' window of a cluster, and alerts as contract JSON."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q, QuerySet

from apps.alerts.choices import OPEN_STATES
from apps.alerts.models import Alert, ClusterDetectorConfig
from apps.clusters.models import Cluster, Node
from apps.runs.choices import RunState
from apps.runs.models import Run, RunEvent
from apps.runs.services import STEP_FIELDS
from apps.telemetry.selectors import MAX_CHUNK_SPAN
from detectors.config import DEFAULT_CONFIG, DetectorConfig
from detectors.goodput import goodput
from detectors.types import ClusterWindow, EventRow, NodeSeen, RunWindow, Series, StepRow

logger = logging.getLogger(__name__)

# The metrics the detectors read (thermal, power, oom_risk, input_bound, ...).
WINDOW_METRICS = (
    "gpu.temp_c",
    "gpu.throttle_reasons",
    "gpu.mem_used_bytes",
    "gpu.mem_total_bytes",
    "gpu.power_w",
    "gpu.power_limit_w",
    "gpu.util",
    "host.cpu_util",
)
# Events that concern a node rather than a run's progress (checkpoints and logs do not).
NODE_EVENT_KINDS = ("xid", "ecc", "oom", "error", "restart")
ALERT_LIST_LIMIT = 1000
# Batch intervals are measured on series every agent sends (one chunk per batch).
INTERVAL_SERIES = (("gpu.util", 0), ("host.cpu_util", -1))
INTERVAL_LOOKBACK_S = 300


def ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def alert_json(alert: Alert) -> dict[str, Any]:
    """The contract's alert object (GET /api/v1/alerts), exactly: no more, no fewer keys."""
    return {
        "id": alert.id,
        "kind": alert.kind,
        "severity": alert.severity,
        "state": alert.state,
        "run": alert.run.name if alert.run_id else None,
        "node": alert.node.name if alert.node_id else None,
        "rank": alert.rank,
        "gpu": alert.gpu,
        "summary": alert.summary,
        "evidence": alert.evidence,
        "opened_at": ts(alert.opened_at),
        "acknowledged_at": ts(alert.acknowledged_at),
        "resolved_at": ts(alert.resolved_at),
    }


def alert_get(*, alert_id: int) -> Alert | None:
    return Alert.objects.select_related("run", "node", "cluster").filter(pk=alert_id).first()


def alert_list(
    *,
    cluster: Cluster | None,
    run: str | None = None,
    node: str | None = None,
    state: str | None = None,
    since: float | None = None,
    limit: int = ALERT_LIST_LIMIT,
) -> list[Alert]:
    """Alerts newest first (of every cluster when `cluster` is None). `since` keeps the
    alerts that changed state (opened, acknowledged, resolved) at or after it."""
    alerts: QuerySet[Alert] = Alert.objects.select_related("run", "node")
    if cluster is not None:
        alerts = alerts.filter(cluster=cluster)
    if run is not None:
        alerts = alerts.filter(run__name=run)
    if node is not None:
        alerts = alerts.filter(node__name=node)
    if state is not None:
        alerts = alerts.filter(state=state)
    if since is not None:
        at = datetime.fromtimestamp(since, UTC)
        alerts = alerts.filter(
            Q(opened_at__gte=at) | Q(acknowledged_at__gte=at) | Q(resolved_at__gte=at)
        )
    return list(alerts.order_by("-opened_at", "-id")[:limit])


def detector_config(*, cluster: Cluster) -> DetectorConfig:
    """The detector thresholds of a cluster: the defaults with its stored overrides."""
    stored = ClusterDetectorConfig.objects.filter(cluster=cluster).first()
    if stored is None or not stored.overrides:
        return DEFAULT_CONFIG
    try:
        return DEFAULT_CONFIG.with_overrides(stored.overrides)
    except (ValueError, TypeError, AttributeError):
        logger.warning("invalid detector overrides of cluster %s ignored", cluster.name)
        return DEFAULT_CONFIG


def clusters_to_evaluate(*, now: float) -> list[Cluster]:
    """Clusters that sent data recently, or that have open alerts (which must resolve)."""
    recent = datetime.fromtimestamp(now - settings.ALERT_IDLE_S, UTC)
    return list(
        Cluster.objects.filter(
            Q(nodes__last_seen__gte=recent) | Q(alerts__state__in=OPEN_STATES)
        ).distinct()
    )


def cluster_window(*, cluster: Cluster, now: float) -> ClusterWindow:
    """Everything the detectors look at for one cluster, in a bounded number of queries
    whatever its size: nodes, active runs (the last ALERT_STEP_WINDOW steps of every rank),
    node events, and recent telemetry of WINDOW_METRICS."""
    nodes = {
        node.id: node
        for node in Node.objects.filter(cluster=cluster).only("id", "name", "state", "last_seen")
    }
    names = {node_id: node.name for node_id, node in nodes.items()}
    intervals = _batch_intervals(node_ids=list(nodes), now=now)
    event_start = datetime.fromtimestamp(now - settings.ALERT_EVENT_WINDOW_S, UTC)
    node_events = RunEvent.objects.filter(
        node_id__in=list(nodes), ts__gte=event_start, kind__in=NODE_EVENT_KINDS
    ).select_related("run")
    return ClusterWindow(
        cluster=cluster.name,
        runs=tuple(_run_windows(cluster=cluster, names=names, now=now)),
        telemetry=tuple(_telemetry(names=names, now=now)),
        nodes=tuple(
            NodeSeen(
                node=node.name,
                last_seen=ts(node.last_seen),
                batch_interval=intervals.get(node_id),
                state=node.state,
            )
            for node_id, node in sorted(nodes.items(), key=lambda item: item[1].name)
        ),
        events=tuple(_event_row(event, names) for event in node_events.order_by("ts", "id")),
    )


def run_window(*, run: Run, now: float) -> RunWindow:
    """One run's window (as in cluster_window), e.g. for its goodput."""
    names = dict(Node.objects.filter(cluster_id=run.cluster_id).values_list("id", "name"))
    return _run_windows(cluster=None, names=names, now=now, runs=[run])[0]


def run_goodput(*, run: Run, now: float) -> dict[str, Any] | None:
    """The run's goodput (detectors.goodput) as plain JSON, over what the bounded window
    holds: since the run started when the window reaches back that far, else since the
    window's first step (or its event horizon, whichever is later). None before any step."""
    if run.last_step is None:
        return None
    window = run_window(run=run, now=now)
    if not window.steps:
        return None
    end = now if run.state == RunState.RUNNING else (ts(run.last_step_at) or now)
    event_start = now - settings.ALERT_EVENT_WINDOW_S
    whole = (run.first_step or 0) > run.last_step - settings.ALERT_STEP_WINDOW and (
        run.created_at.timestamp() >= event_start
    )
    first = min(row.ts - row.step_time for row in window.steps)
    since = None if whole else max(first, event_start)
    return goodput(window, end, since=since).to_dict()


def _active_runs(cluster: Cluster, now: float) -> list[Run]:
    recent = datetime.fromtimestamp(now - settings.ALERT_IDLE_S, UTC)
    return list(
        Run.objects.filter(cluster=cluster, state=RunState.RUNNING).filter(
            Q(last_step_at__gte=recent) | Q(last_step_at__isnull=True, created_at__gte=recent)
        )
    )


def _run_windows(
    *, cluster: Cluster | None, names: dict[int, str], now: float, runs: list[Run] | None = None
) -> list[RunWindow]:
    runs = _active_runs(cluster, now) if runs is None else runs
    if not runs:
        return []
    steps = _steps(runs, names)
    events = _run_events(runs, now)
    windows = []
    for run in runs:
        rows = steps.get(run.id, [])
        rank_nodes = {row.rank: row.node for row in rows}  # oldest first: the latest wins
        windows.append(
            RunWindow(
                run=run.name,
                world_size=run.world_size,
                started_at=ts(run.created_at),
                steps=tuple(rows),
                events=tuple(_event_row(event, names) for event in events.get(run.id, ())),
                rank_nodes=rank_nodes,
            )
        )
    return windows


# node_id, ts, rank, step, step_time, ...: the stored step record's columns
_STEP_COLUMNS = STEP_FIELDS[1:]


def _steps(runs: list[Run], names: dict[int, str]) -> dict[int, list[StepRow]]:
    """The last ALERT_STEP_WINDOW steps of every rank of each run, oldest first: one query
    on the (run_id, step) index for all runs (rows become StepRows without a model)."""
    window = settings.ALERT_STEP_WINDOW
    sql = (
        f"SELECT s.run_id, {', '.join('s.' + name for name in _STEP_COLUMNS)}"
        " FROM unnest(%s::bigint[], %s::bigint[]) AS r(id, after)"
        " JOIN runs_stepreport s ON s.run_id = r.id AND s.step > r.after"
        " ORDER BY s.run_id, s.step, s.rank"
    )
    by_run: dict[int, list[StepRow]] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            sql, [[run.id for run in runs], [(run.last_step or 0) - window for run in runs]]
        )
        for run_id, node_id, at, *fields in cursor.fetchall():
            row = dict(zip(_STEP_COLUMNS[2:], fields, strict=True))
            if row["canary_proj"] is not None:
                row["canary_proj"] = tuple(row["canary_proj"])
            by_run.setdefault(run_id, []).append(
                StepRow(node=names.get(node_id, str(node_id)), ts=at.timestamp(), **row)
            )
    return by_run


def _run_events(runs: list[Run], now: float) -> dict[int, list[RunEvent]]:
    """Recent events of the runs, and each run's newest checkpoint event of every tier and
    state however old (staleness needs the last durable completed one)."""
    run_ids = [run.id for run in runs]
    start = datetime.fromtimestamp(now - settings.ALERT_EVENT_WINDOW_S, UTC)
    recent = RunEvent.objects.filter(run_id__in=run_ids, ts__gte=start).select_related("run")
    latest = (
        RunEvent.objects.filter(run_id__in=run_ids, kind="checkpoint", ts__lt=start)
        .select_related("run")
        .order_by("run_id", "data__tier", "data__state", "-ts")
        .distinct("run_id", "data__tier", "data__state")
    )
    by_run: dict[int, list[RunEvent]] = {}
    for event in sorted([*recent, *latest], key=lambda event: (event.ts, event.id)):
        by_run.setdefault(event.run_id, []).append(event)
    return by_run


def _event_row(event: RunEvent, names: dict[int, str]) -> EventRow:
    return EventRow(
        ts=event.ts.timestamp(),
        kind=event.kind,
        node=names.get(event.node_id, str(event.node_id)),
        run=event.run.name if event.run_id else None,
        step=event.step,
        rank=event.rank,
        gpu=event.gpu,
        data=event.data,
    )


_TELEMETRY_SQL = f"""
WITH c AS (
    SELECT node_id, metric_id, gpu, extract(epoch FROM t0)::float8 AS e0, offsets_ms, vals
    FROM telemetry_chunk
    WHERE node_id = ANY(%(nodes)s) AND metric_id = ANY(%(metrics)s)
      AND t0 < to_timestamp(%(end)s)
      AND t0 >= to_timestamp(%(start)s) - interval '{MAX_CHUNK_SPAN}'
      AND t1 >= to_timestamp(%(start)s)
)
SELECT node_id, metric_id, gpu, ts, v FROM (
    SELECT node_id, metric_id, gpu, e0 + o / 1000.0 AS ts, v
    FROM c, unnest(c.offsets_ms, c.vals) AS u(o, v)
) p WHERE ts >= %(start)s AND ts < %(end)s
ORDER BY node_id, metric_id, gpu, ts
"""


def _telemetry(*, names: dict[int, str], now: float) -> list[Series]:
    """The last ALERT_TELEMETRY_WINDOW_S of WINDOW_METRICS on every node: one query."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, name FROM telemetry_metric WHERE name = ANY(%s)", [list(WINDOW_METRICS)]
        )
        metrics = dict(cursor.fetchall())
        if not metrics or not names:
            return []
        cursor.execute(
            _TELEMETRY_SQL,
            {
                "nodes": list(names),
                "metrics": list(metrics),
                "start": now - settings.ALERT_TELEMETRY_WINDOW_S,
                "end": now + 1,
            },
        )
        rows = cursor.fetchall()
    series: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for node_id, metric_id, gpu, at, value in rows:
        series.setdefault((node_id, metric_id, gpu), []).append((at, value))
    return [
        Series(
            node=names[node_id],
            metric=metrics[metric_id],
            gpu=None if gpu < 0 else gpu,
            points=tuple(points),
        )
        for (node_id, metric_id, gpu), points in series.items()
    ]


# A raw chunk holds one batch of one series, so the gaps between the starts of a series'
# consecutive raw chunks are the node's batch interval.
_INTERVAL_SQL = """
WITH c AS (
    SELECT c.node_id, c.metric_id, c.gpu, c.t0,
           extract(epoch FROM c.t0 - lag(c.t0) OVER (
               PARTITION BY c.node_id, c.metric_id, c.gpu ORDER BY c.t0))::float8 AS gap
    FROM telemetry_chunk c JOIN telemetry_metric m ON m.id = c.metric_id
    JOIN unnest(%(names)s::text[], %(gpus)s::int[]) AS s(name, gpu)
      ON s.name = m.name AND s.gpu = c.gpu
    WHERE c.node_id = ANY(%(nodes)s) AND NOT c.sealed AND c.t0 >= to_timestamp(%(start)s)
)
SELECT node_id, percentile_cont(0.5) WITHIN GROUP (ORDER BY gap)
FROM c WHERE gap > 0 GROUP BY node_id
"""


def _batch_intervals(*, node_ids: list[int], now: float) -> dict[int, float]:
    """Median seconds between a node's recent batches, for nodes that sent several."""
    if not node_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            _INTERVAL_SQL,
            {
                "names": [name for name, _ in INTERVAL_SERIES],
                "gpus": [gpu for _, gpu in INTERVAL_SERIES],
                "nodes": node_ids,
                "start": now - INTERVAL_LOOKBACK_S,
            },
        )
        return {node_id: float(gap) for node_id, gap in cursor.fetchall()}
