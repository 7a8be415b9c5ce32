"""The detectors' window of a cluster: what they look at, in a bounded number of queries.

Live (`as_of=False`): the latest steps of each active run and the nodes' server-side
last_seen. As of a past `now` (`as_of=True`, the evaluation harness's replay): only rows
whose own timestamps are at or before `now`, and last_seen and batch intervals derived from
those timestamps, as if every record had arrived at the moment it carries.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from functools import partial
from itertools import groupby
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q

from apps.alerts.selectors.replay import (
    INTERVAL_LOOKBACK_S,
    replay_intervals,
    replay_last_seen,
    replay_runs,
)
from apps.clusters.models import Cluster, Node
from apps.core.db import query_logged, server_cursor
from apps.runs.choices import RunState
from apps.runs.models import Run, RunEvent
from apps.runs.selectors import event_row, run_events_recent
from apps.telemetry.selectors import series_points
from detectors.types import ClusterWindow, NodeSeen, RunWindow, Series, StepRow

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


def cluster_window(*, cluster: Cluster, now: float, as_of: bool = False) -> ClusterWindow:
    """Everything the detectors look at for one cluster, in a bounded number of queries
    whatever its size: nodes, active runs (the last ALERT_STEP_WINDOW steps of every rank),
    node events, and recent telemetry of WINDOW_METRICS. With `as_of`, the window as it
    stood at a past `now` (see the module docstring)."""
    everyone = list(
        Node.objects.filter(cluster=cluster).only("id", "name", "state", "last_seen", "has_agent")
    )
    names = {node.id: node.name for node in everyone}
    # Only nodes with a node agent can go missing (heartbeat); one heard only from inside a
    # training job follows its run: idle once the run ended, and `hang` speaks when the run
    # stops without ending (no silent node of its own then excuses the stall).
    nodes = {node.id: node for node in everyone if node.has_agent}
    telemetry = _telemetry(names=names, now=now, end=now + (1e-3 if as_of else 1.0))
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
        runs=tuple(_run_windows(names=names, now=now, runs=runs, started=started)),
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
    *, names: dict[int, str], now: float, runs: list[Run], started: dict[int, float] | None = None
) -> list[RunWindow]:
    """`started` (as of a past now): each run's start from its data, and every row read is
    at or before `now`; None: live, the run's created_at and its latest rows."""
    if not runs:
        return []
    until = None if started is None else now
    steps = _steps(runs, names=names, until=until)
    events = run_events_recent(runs, now, until=until)
    windows = []
    for run in runs:
        rows = steps.get(run.id, [])
        rank_nodes = {row.rank: row.node for row in rows}  # oldest first: the latest wins
        windows.append(
            RunWindow(
                run=run.name,
                world_size=run.world_size,
                started_at=ts(run.created_at) if started is None else started.get(run.id),
                steps=tuple(rows),
                events=tuple(event_row(event, names) for event in events.get(run.id, ())),
                rank_nodes=rank_nodes,
            )
        )
    return windows


# StepRow's fields after `node`, in its order, as stored columns: rows load positionally, and
# ts as epoch seconds (a float loads far faster than a timestamptz: 30 k rows a window).
# date_part, not extract: extract's numeric cost Postgres 7 ms of a pass's 30 k rows, and
# both are the double nearest the exact seconds (one correctly rounded division).
_STEPROW_FIELDS = list(StepRow._fields)[1:]
_STEPROW_COLUMNS = ", ".join(
    "date_part('epoch', ts)" if name == "ts" else name for name in _STEPROW_FIELDS
)
_CANARY_PROJ = _STEPROW_FIELDS.index("canary_proj") + 2  # after run_id and the node id
_RANK, _STEP, _TS = (1 + StepRow._fields.index(name) for name in ("rank", "step", "ts"))
# StepRow._make without its length check (the columns are its fields)
_step_row = partial(tuple.__new__, StepRow)
# A rank reports a step once per timeline; twice covers a restart inside the window.
STEP_REPORTS_PER_RANK_STEP = 2


def _steps(
    runs: list[Run], *, names: dict[int, str], until: float | None
) -> dict[int, list[StepRow]]:
    """The last ALERT_STEP_WINDOW steps of every rank of each run (reported at or before
    `until`, if given), ordered by step, rank, then time, at most world size ×
    ALERT_STEP_WINDOW × STEP_REPORTS_PER_RANK_STEP reports a run: one statement, a run's
    index range each (rows become StepRows without a model)."""
    caps = {run.id: _reports_cap(run) for run in runs}
    rows = _steps_fetch(runs, until, ordered=False, caps=caps)
    # A run over its cap (ranks that report steps again and again) is read once more, its
    # highest steps' newest reports only; the usual window needs no sort in Postgres.
    counts = Counter(map(itemgetter(0), rows))
    over = [run for run in runs if counts[run.id] > caps[run.id]]
    if over:
        ids = {run.id for run in over}
        rows = [row for row in rows if row[0] not in ids]
        rows += _steps_fetch(over, until, ordered=True, caps=caps)
    # Sorted here, not by an ORDER BY: Postgres sorted the wide rows on disk (past
    # work_mem) for ~10 ms a pass; Python sorts the tuples in place in less than half that.
    rows.sort(key=itemgetter(0, _STEP, _RANK, _TS))
    return _step_rows(rows, names)


def _reports_cap(run: Run) -> int:
    return max(1, run.world_size) * settings.ALERT_STEP_WINDOW * STEP_REPORTS_PER_RANK_STEP


def _steps_fetch(
    runs: list[Run], until: float | None, *, ordered: bool, caps: dict[int, int]
) -> list[tuple]:
    """(run_id, node_id, StepRow's fields after node...) rows of each run's window: unordered
    up to its cap + 1 (one more than the cap says it was over), or `ordered`, its cap's
    highest steps' newest."""
    sql, params = _steps_query(runs, until, ordered=ordered, caps=caps)
    # binary: floats and integers load without text parsing on either side (a pass's
    # 30 k reports cost Postgres ~20 ms of output formatting and the worker as much again)
    with query_logged(connection, sql), server_cursor() as cursor:
        cursor.execute(sql, params, binary=True, prepare=False)
        return cursor.fetchall()


def _steps_query(
    runs: list[Run], until: float | None, *, ordered: bool, caps: dict[int, int]
) -> tuple[str, list[Any]]:
    # One branch per run with its own bounds, bound to a statement never prepared (psycopg
    # prepares one run 5 times, and a generic plan does not know the bounds): the planner sees
    # how few rows `step > n` leaves (a join against unnest()'d bounds hid them, and on a 22
    # M-report table it chose a parallel scan of every row: 22 s). Only the run's current
    # timeline: after a restart (its step counter went back) the old timeline's reports of the
    # same step numbers are history, not progress. At most world size × ALERT_STEP_WINDOW ×
    # STEP_REPORTS_PER_RANK_STEP reports a run: the whole window of a run whose ranks report
    # each step once per timeline; a rank that reports one step again and again (the soak's
    # batches all say step 100) made every pass read every report since the run started
    # (docs/faults.md, 10). Unordered, a branch stops at one report past that cap; ordered
    # (a run over its cap), it keeps the highest steps' newest. The node's id, not a join to
    # its name: the names are at hand, and the join's 30 k lookups cost Postgres ~20 ms.
    branch = (
        f"(SELECT run_id, node_id, {_STEPROW_COLUMNS} FROM runs_stepreport"
        " WHERE run_id = %s AND step > %s AND ts > %s"
        + ("" if until is None else " AND ts <= to_timestamp(%s)")
        + (" ORDER BY step DESC, ts DESC" if ordered else "")
        + " LIMIT %s)"
    )
    params: list[Any] = []
    for run in runs:
        params += [run.id, (run.last_step or 0) - settings.ALERT_STEP_WINDOW, _after(run, until)]
        params += [] if until is None else [until]
        params.append(caps[run.id] + (0 if ordered else 1))
    return " UNION ALL ".join([branch] * len(runs)), params


def _step_rows(rows: list[tuple], names: dict[int, str]) -> dict[int, list[StepRow]]:
    """Each run's StepRows of (run_id, node_id, fields after node...) rows ordered by run;
    one comprehension, no loop body per row (30 k a window: the per-row work is most of
    the window's Python; building columns and zipping them back cost more)."""
    node = _NodeNames(names)
    return {
        run_id: [
            _step_row((node[row[1]], *row[2:]))
            if row[_CANARY_PROJ] is None
            else _with_canary(row, node)
            for row in group
        ]
        for run_id, group in groupby(rows, itemgetter(0))
    }


class _NodeNames(dict[int, str]):
    """Node id → name; an id the cluster's nodes lack reads as itself."""

    def __missing__(self, node_id: int) -> str:
        return str(node_id)


def _with_canary(row: tuple, names: dict[int, str]) -> StepRow:
    node = names[row[1]]
    proj = tuple(row[_CANARY_PROJ])
    return _step_row((node, *row[2:_CANARY_PROJ], proj, *row[_CANARY_PROJ + 1 :]))


def _after(run: Run, until: float | None) -> datetime:
    """Reports after this are the run's current timeline (as of `until`, when replaying:
    a restart later than that had not happened yet)."""
    after = run.timeline_after
    if after is None or (until is not None and after.timestamp() >= until):
        return datetime.min.replace(tzinfo=UTC)
    return after


def _telemetry(*, names: dict[int, str], now: float, end: float) -> list[Series]:
    """WINDOW_METRICS on every node from ALERT_TELEMETRY_WINDOW_S before `now` up to `end`
    (exclusive), at most a point per series per ALERT_TELEMETRY_RESOLUTION_S: one query."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, name FROM telemetry_metric WHERE name = ANY(%s)", [list(WINDOW_METRICS)]
        )
        metrics = dict(cursor.fetchall())
    if not metrics or not names:
        return []
    # decoded in Python: sealed (compacted) chunks keep their points encoded
    series = series_points(
        node_ids=list(names),
        metric_ids=list(metrics),
        start=now - settings.ALERT_TELEMETRY_WINDOW_S,
        end=end,
        resolution=settings.ALERT_TELEMETRY_RESOLUTION_S,
    )
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
