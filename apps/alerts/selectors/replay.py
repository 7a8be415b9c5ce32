"""The parts of a cluster's window that differ when it is read as of a past `now`.

The evaluation harness replays a simulated scenario that was ingested faster than real
time, so the server's own clocks (Node.last_seen, Run.created_at, Run.last_step) say when
the rows arrived, not when they happened. Here the same facts are derived from the rows'
own timestamps, bounded by `now`: a record counts as arrived at the moment it carries.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.conf import settings
from django.db import connection

from apps.clusters.models import Cluster
from apps.runs.models import Run
from apps.telemetry.selectors import MAX_CHUNK_SPAN
from detectors.types import Series

# How far back a silent node's last record is looked for: a node silent longer than this
# is no longer in the window (as a live node last seen that long ago would be idle).
LAST_SEEN_LOOKBACK = MAX_CHUNK_SPAN
INTERVAL_LOOKBACK_S = 300

_RUNS_SQL = """
SELECT r.id, l.step, l.ts, (
    SELECT min(s.ts - s.step_time * interval '1 second') FROM runs_stepreport s
    WHERE s.run_id = r.id AND s.step = r.first_step
) AS started
FROM runs_run r
CROSS JOIN LATERAL (
    SELECT s.step, s.ts FROM runs_stepreport s
    WHERE s.run_id = r.id AND s.ts <= to_timestamp(%(now)s)
    ORDER BY s.step DESC LIMIT 1
) l
WHERE r.cluster_id = %(cluster)s AND l.ts >= to_timestamp(%(now)s - %(idle)s)
  AND NOT EXISTS (  -- ended (run_end) after its last step as of now: not evaluated
    SELECT 1 FROM runs_runevent e WHERE e.run_id = r.id AND e.kind = 'run_end'
      AND e.ts >= l.ts AND e.ts <= to_timestamp(%(now)s)
  )
"""


def replay_runs(*, cluster: Cluster, now: float) -> tuple[list[Run], dict[int, float]]:
    """The runs that had stepped within ALERT_IDLE_S before `now` and had not ended (a
    run_end after their last step) by then, each with last_step and last_step_at as of `now`
    (set on the instance only, never saved), and their start times (first step's start) by
    run id."""
    with connection.cursor() as cursor:
        cursor.execute(
            _RUNS_SQL, {"cluster": cluster.pk, "now": now, "idle": settings.ALERT_IDLE_S}
        )
        rows = cursor.fetchall()
    by_id = Run.objects.in_bulk([row[0] for row in rows])
    runs, started = [], {}
    for run_id, step, at, first in rows:
        run = by_id[run_id]
        run.last_step, run.last_step_at = step, at
        runs.append(run)
        if isinstance(first, datetime):
            started[run_id] = first.timestamp()
    return runs, started


_LAST_SEEN_SQL = f"""
SELECT node_id, extract(epoch FROM max(seen))::float8 FROM (
    SELECT node_id, least(t1, to_timestamp(%(now)s)) AS seen FROM telemetry_chunk
    WHERE node_id = ANY(%(nodes)s) AND t0 <= to_timestamp(%(now)s)
      AND t0 >= to_timestamp(%(now)s) - interval '{LAST_SEEN_LOOKBACK}'
    UNION ALL
    SELECT node_id, ts FROM runs_stepreport
    WHERE node_id = ANY(%(nodes)s) AND ts <= to_timestamp(%(now)s)
      AND ts >= to_timestamp(%(now)s - %(steps_back)s)
) seen GROUP BY node_id
"""


def replay_last_seen(*, node_ids: Sequence[int], now: float) -> dict[int, float]:
    """Each node's newest sample or step report at or before `now`. A chunk that began by
    `now` and ends after it had samples up to about `now` (its batch was being taken)."""
    if not node_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            _LAST_SEEN_SQL,
            {"nodes": list(node_ids), "now": now, "steps_back": settings.ALERT_IDLE_S},
        )
        return {node_id: seen for node_id, seen in cursor.fetchall() if seen is not None}


def replay_intervals(
    *,
    telemetry: Iterable[Series],
    names: dict[int, str],
    series: Iterable[tuple[str, int]],
) -> dict[int, float]:
    """Each node's usual interval between records: the median gap between the timestamps
    of one of `series` (metric, gpu; -1 = host) over the window's last few minutes. (Live,
    it is the gap between batches; replayed, a record arrives at its own timestamp.)"""
    wanted = {(metric, None if gpu < 0 else gpu) for metric, gpu in series}
    ids = {name: node_id for node_id, name in names.items()}
    intervals: dict[int, float] = {}
    for item in telemetry:
        if (item.metric, item.gpu) not in wanted or ids.get(item.node) in intervals:
            continue
        newest = item.points[-1][0] if item.points else 0.0
        times = [at for at, _ in item.points if at >= newest - INTERVAL_LOOKBACK_S]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
        if gaps:
            intervals[ids[item.node]] = statistics.median(gaps)
    return intervals
