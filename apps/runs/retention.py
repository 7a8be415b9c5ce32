"""Retention of run events (`runs_runevent`; docs/operations.md, Retention), and of step
completions (`runs_stepcompletion`, as long as the raw reports they are computed from).

Two rules, because events grow two ways:

- **After a run is over.** A run's events are its timeline: they are kept whole while the
  run is young, and deleted once they are older than RUN_EVENTS_RETENTION_DAYS and the run
  has neither stepped nor ended within that time (a run killed without a run_end counts as
  over once it stops stepping). Node events (no run: xid, ecc, oom of a node agent) go by
  their own age.
- **Within a live run.** Agents send events as they please (a log event per line, say), and
  a run may live for months: each run keeps the newest RUN_EVENTS_MAX_PER_RUN events of each
  kind, so a flood of one kind never pushes out another. The newest checkpoint event of each
  tier and state is always kept: checkpoint staleness and the work at risk read it however
  old (apps.runs.selectors.run_events_recent). How many were dropped is logged per run and
  kind, and returned by the pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from apps.core.prune import batches_delete, expired_delete

logger = logging.getLogger(__name__)

# greatest() skips NULLs: a run that never stepped is judged by its end, else its creation
EXPIRED = (
    "ts < %(cutoff)s AND (run_id IS NULL OR run_id IN ("
    "SELECT id FROM runs_run WHERE greatest(ended_at, last_step_at, created_at) < %(cutoff)s))"
)
OVER_CAP_SQL = """
SELECT run_id, kind, count(*) FROM runs_runevent WHERE run_id IS NOT NULL
GROUP BY run_id, kind HAVING count(*) > %(cap)s ORDER BY run_id, kind
"""
# The events of one run and kind past its newest %(cap)s, but never the run's newest
# checkpoint of a tier and state. A batch holding one of those deletes one row short and ends
# the run's pass early: the next pass goes on.
CAP_SQL = """
DELETE FROM runs_runevent WHERE id IN (
  SELECT id FROM runs_runevent WHERE run_id = %(run)s AND kind = %(kind)s
  ORDER BY ts DESC, id DESC OFFSET %(cap)s LIMIT %(batch)s
) AND id NOT IN (
  SELECT DISTINCT ON (data->>'tier', data->>'state') id FROM runs_runevent
  WHERE run_id = %(run)s AND kind = 'checkpoint'
  ORDER BY data->>'tier', data->>'state', ts DESC, id DESC
)
"""


@dataclass
class EventsPruned:
    expired: int = 0  # events of runs over (and node events) past the retention
    completions: int = 0  # step completions past the raw reports' retention
    dropped: dict[str, int] = field(default_factory=dict)  # "run id/kind" → events over the cap


def run_events_prune(*, now: datetime) -> EventsPruned:
    """Delete the expired events, then cap every run's events of each kind (each rule off
    when its setting is 0). Bounded batches (apps.core.prune): a pass cut short loses
    nothing, the next goes on."""
    result = EventsPruned()
    days = settings.RUN_EVENTS_RETENTION_DAYS
    if days:
        result.expired = expired_delete(
            table="runs_runevent", expired=EXPIRED, params={"cutoff": now - timedelta(days=days)}
        )
    cap = settings.RUN_EVENTS_MAX_PER_RUN
    if cap:
        result.dropped = run_events_cap(cap=cap)
    raw_days = settings.HISTORY_RAW_RETENTION_DAYS
    if raw_days:  # a completion is recomputed from raw reports: kept as long as they are
        result.completions = expired_delete(
            table="runs_stepcompletion",
            expired="t1 < %(cutoff)s",
            params={"cutoff": now - timedelta(days=raw_days)},
        )
    return result


def run_events_cap(*, cap: int) -> dict[str, int]:
    """Keep each run's newest `cap` events of every kind (and its newest checkpoint of each
    tier and state); returns the events dropped by "run id/kind"."""
    with connection.cursor() as cursor:
        cursor.execute(OVER_CAP_SQL, {"cap": cap})
        over = cursor.fetchall()
    dropped: dict[str, int] = {}
    for run_id, kind, count in over:
        params = {"run": run_id, "kind": kind, "cap": cap}
        deleted = batches_delete(sql=CAP_SQL, params=params, what=f"{kind} events of run {run_id}")
        if deleted:
            dropped[f"{run_id}/{kind}"] = deleted
            logger.warning(
                "run %s had %s %s events: dropped its oldest %s (RUN_EVENTS_MAX_PER_RUN %s)",
                run_id, count, kind, deleted, cap,
            )  # fmt: skip
    return dropped
