"""The detectors' window of a cluster: what they look at, in a bounded number of queries.

Live (`as_of=False`): the latest steps of each active run and the nodes' server-side
last_seen. As of a past `now` (`as_of=True`, the evaluation harness's replay): only rows
whose own timestamps are at or before `now`, and last_seen and batch intervals derived from
those timestamps, as if every record had arrived at the moment it carries.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import chain

from django.conf import settings
from django.db import connection
from django.db.models import Q

from apps.alerts.selectors.kept import KeptWindow, steps_kept
from apps.alerts.selectors.kept_telemetry import live_telemetry_end, telemetry_kept
from apps.alerts.selectors.replay import (
    INTERVAL_LOOKBACK_S,
    replay_intervals,
    replay_last_seen,
    replay_runs,
)
from apps.alerts.selectors.steps import steps_load
from apps.clusters.models import Cluster, Node
from apps.runs.choices import RunState
from apps.runs.models import Run, RunEvent
from apps.runs.selectors import event_row, run_events_recent
from apps.telemetry.selectors import series_columns
from detectors.types import ClusterWindow, NodeSeen, RunWindow, Series

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
# Batch intervals are measured on series every agent sends (one chunk per batch).
INTERVAL_SERIES = (("gpu.util", 0), ("host.cpu_util", -1))


def ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def cluster_window(
    *, cluster: Cluster, now: float, as_of: bool = False, kept: KeptWindow | None = None
) -> ClusterWindow:
    """Everything the detectors look at for one cluster, in a bounded number of queries
    whatever its size: nodes, active runs (the last ALERT_STEP_WINDOW steps of every rank),
    node events, and recent telemetry of WINDOW_METRICS. With `as_of`, the window as it
    stood at a past `now` (see the module docstring). A live window with `kept` reads only
    the steps that changed since the pass that left it (apps.alerts.selectors.kept)."""
    everyone = list(
        Node.objects.filter(cluster=cluster).only("id", "name", "state", "last_seen", "has_agent")
    )
    names = {node.id: node.name for node in everyone}
    # Only nodes with a node agent can go missing (heartbeat); one heard only from inside a
    # training job follows its run: idle once the run ended, and `hang` speaks when the run
    # stops without ending (no silent node of its own then excuses the stall).
    nodes = {node.id: node for node in everyone if node.has_agent}
    telemetry = _telemetry(
        names=names,
        now=now,
        end=now + 1e-3 if as_of else live_telemetry_end(now),
        kept=None if as_of else kept,
    )
    if as_of:
        runs, started = replay_runs(cluster=cluster, now=now)
        last_seen = replay_last_seen(node_ids=list(nodes), now=now)
        intervals = replay_intervals(telemetry=telemetry, names=names, series=INTERVAL_SERIES)
    else:
        runs, started = _active_runs(cluster, now), None
        last_seen = {node_id: ts(node.last_seen) for node_id, node in nodes.items()}
        intervals = _batch_intervals(node_ids=list(nodes), now=now)
    node_events = RunEvent.objects.filter(
        node_id__in=list(names), ts__gte=_at(now - settings.ALERT_EVENT_WINDOW_S)
    ).filter(kind__in=NODE_EVENT_KINDS)
    if as_of:
        node_events = node_events.filter(ts__lte=_at(now))
    return ClusterWindow(
        cluster=cluster.name,
        runs=tuple(_run_windows(names=names, now=now, runs=runs, started=started, kept=kept)),
        telemetry=tuple(telemetry),
        nodes=tuple(
            NodeSeen(
                node=node.name,
                last_seen=last_seen.get(node_id),
                batch_interval=intervals.get(node_id),
                state=node.state,
            )
            for node_id, node in sorted(nodes.items(), key=lambda item: item[1].name)
        ),
        events=tuple(
            event_row(event, names)
            for event in node_events.select_related("run").order_by("ts", "id")
        ),
    )


def run_window(*, run: Run, now: float) -> RunWindow:
    """One run's window (as in cluster_window), e.g. for its goodput."""
    names = dict(Node.objects.filter(cluster_id=run.cluster_id).values_list("id", "name"))
    return _run_windows(names=names, now=now, runs=[run])[0]


def _active_runs(cluster: Cluster, now: float) -> list[Run]:
    recent = datetime.fromtimestamp(now - settings.ALERT_IDLE_S, UTC)
    return list(
        Run.objects.filter(cluster=cluster, state=RunState.RUNNING).filter(
            Q(last_step_at__gte=recent) | Q(last_step_at__isnull=True, created_at__gte=recent)
        )
    )


def _at(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _run_windows(
    *,
    names: dict[int, str],
    now: float,
    runs: list[Run],
    started: dict[int, float] | None = None,
    kept: KeptWindow | None = None,
) -> list[RunWindow]:
    """`started` (as of a past now): each run's start from its data, and every row read is
    at or before `now`; None: live, the run's created_at and its latest rows, updating the
    steps `kept` from this worker's last pass when given (apps.alerts.selectors.kept)."""
    if not runs:
        return []
    until = None if started is None else now
    groups = None
    if kept is not None and until is None:
        groups = steps_kept(runs, names=names, kept=kept)
    steps = steps_load(runs, names=names, until=until) if groups is None else {}
    events = run_events_recent(runs, now, until=until)
    windows = []
    for run in runs:
        if groups is not None:  # the rows say which rank is where (common.rank_nodes)
            by_step = groups[run.id]
            rows, rank_nodes = tuple(chain.from_iterable(by_step.values())), {}
        else:
            by_step, rows = None, tuple(steps.get(run.id, ()))
            rank_nodes = {row.rank: row.node for row in rows}  # oldest first: the latest wins
        windows.append(
            RunWindow(
                run=run.name,
                world_size=run.world_size,
                started_at=ts(run.created_at) if started is None else started.get(run.id),
                steps=rows,
                events=tuple(event_row(event, names) for event in events.get(run.id, ())),
                rank_nodes=rank_nodes,
                by_step=by_step,
            )
        )
    return windows


def _telemetry(
    *, names: dict[int, str], now: float, end: float, kept: KeptWindow | None = None
) -> list[Series]:
    """WINDOW_METRICS on every node from ALERT_TELEMETRY_WINDOW_S before `now` up to `end`
    (exclusive), at most a point per series per ALERT_TELEMETRY_RESOLUTION_S: one query, or
    with `kept` (a live window: `end` is live_telemetry_end) only what changed since the pass
    that left it (apps.alerts.selectors.kept_telemetry)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, name FROM telemetry_metric WHERE name = ANY(%s)", [list(WINDOW_METRICS)]
        )
        metrics = dict(cursor.fetchall())
    if not metrics or not names:
        return []
    if kept is not None:
        return telemetry_kept(names=names, metrics=metrics, now=now, kept=kept.telemetry)
    # decoded in Python: sealed (compacted) chunks keep their points encoded
    series = series_columns(
        node_ids=list(names),
        metric_ids=list(metrics),
        start=now - settings.ALERT_TELEMETRY_WINDOW_S,
        end=end,
        resolution=settings.ALERT_TELEMETRY_RESOLUTION_S,
    ).columns()
    return [
        Series(
            names[node_id], metrics[metric_id], None if gpu < 0 else gpu, times=ts, values=values
        )
        for (node_id, metric_id, gpu), (ts, values) in series.items()
    ]


# A raw chunk holds one batch of one series, so the gaps between the starts of a series'
# consecutive raw chunks are the node's batch interval. Each (node, series) is its own index
# range of the chunks' (node, metric, gpu, t0) btree: the LATERAL with OFFSET 0 keeps the
# planner from flattening it into one scan by time, which read the recent chunks of every
# cluster's nodes for each cluster's pass (35 ms of Postgres a pass at 64 clusters; 0.6 now).
_INTERVAL_SQL = """
WITH c AS (
    SELECT n.id AS node_id,
           extract(epoch FROM c.t0 - lag(c.t0) OVER (
               PARTITION BY n.id, s.metric_id, s.gpu ORDER BY c.t0))::float8 AS gap
    FROM unnest(%(nodes)s::int8[]) AS n(id)
    CROSS JOIN (
        SELECT m.id AS metric_id, s.gpu
        FROM unnest(%(names)s::text[], %(gpus)s::int[]) AS s(name, gpu)
        JOIN telemetry_metric m ON m.name = s.name
    ) s
    CROSS JOIN LATERAL (
        SELECT t0 FROM telemetry_chunk c
        WHERE c.node_id = n.id AND c.metric_id = s.metric_id AND c.gpu = s.gpu
          AND c.t0 >= to_timestamp(%(start)s) AND NOT c.sealed
        OFFSET 0
    ) c
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
