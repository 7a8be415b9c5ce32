"""Which steps of which run got new reports, for readers that keep a window between passes.

`steps_store` records, in ingest's transaction, run id → (first step, last step) of the
reports it stored, twice in one statement: a mark for the completions' refresh (claimed and
deleted by it, apps.runs.completions) and a row of the change log `runs_stepchange`, keyed
by the writing transaction's id and read by any number of readers (the detectors' windows
kept by each periodic worker, apps.alerts.selectors.kept).

Why transaction ids and not a serial or a time: ids are handed out before commit, and a
transaction that began earlier may commit later, so "rows after the last one I saw" misses
it. A reader instead remembers the oldest transaction still running when its pass began
(`pg_snapshot_xmin`, its watermark) and next time reads every change whose writer's id is at
or above it: a writer below it had finished before that pass read anything, so its reports
were read then (or by an earlier pass, by the same argument); a writer at or above it may
not have committed then, and is read now. Some changes are read twice: reloading a step is
idempotent.

The log is pruned after STEP_CHANGES_KEEP_S; the prune raises the horizon (the highest id it
deleted), and a reader whose watermark is not above it reloads its window whole.
"""

from __future__ import annotations

from typing import NamedTuple

from django.db import connection

from apps.core.db import server_cursor

# Long enough for any live reader (a kept window older than a minute is reloaded whole).
STEP_CHANGES_KEEP_S = 120.0

_RECORD_SQL = """
WITH stored(run_id, s0, s1) AS (SELECT * FROM unnest(%b::int8[], %b::int8[], %b::int8[])),
marked AS (INSERT INTO runs_completiondirty (run_id, s0, s1) SELECT * FROM stored)
INSERT INTO runs_stepchange (run_id, s0, s1) SELECT * FROM stored
"""

_PRUNE_SQL = """
WITH gone AS (
    DELETE FROM runs_stepchange WHERE at < clock_timestamp() - make_interval(secs => %s)
    RETURNING xid
)
UPDATE runs_stepchangehorizon SET xid = greatest(xid, (SELECT max(xid) FROM gone))
WHERE id = 1 AND EXISTS (SELECT FROM gone)
"""


class ChangeSnapshot(NamedTuple):
    """Where a reader stands: the oldest transaction still running now (the next pass's
    watermark) and the prune horizon (a watermark at or below it has lost changes)."""

    xmin: int
    horizon: int


def steps_mark_changed(*, steps: dict[int, tuple[int, int]]) -> None:
    """Record run id → (first step, last step) of step reports just stored, for the
    completions and in the change log; call in the transaction that stored them."""
    if not steps:
        return
    runs = sorted(steps)
    with server_cursor() as cursor:
        cursor.execute(
            _RECORD_SQL, [runs, [steps[r][0] for r in runs], [steps[r][1] for r in runs]]
        )


def step_changes_snapshot() -> ChangeSnapshot:
    """Take before reading anything the changes will be compared with."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,"
            " (SELECT xid FROM runs_stepchangehorizon WHERE id = 1)"
        )
        xmin, horizon = cursor.fetchone()
    return ChangeSnapshot(xmin, horizon or 0)


def step_changes_since(*, run_ids: list[int], xid: int) -> dict[int, list[tuple[int, int]]]:
    """run id → its changed step ranges (first, last), merged where they overlap or touch,
    written by transactions with ids at or above `xid`."""
    if not run_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT run_id, s0, s1 FROM runs_stepchange WHERE xid >= %s AND run_id = ANY(%s)"
            " ORDER BY run_id, s0",
            [xid, run_ids],
        )
        out: dict[int, list[tuple[int, int]]] = {}
        for run_id, s0, s1 in cursor.fetchall():
            ranges = out.setdefault(run_id, [])
            if ranges and s0 <= ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], max(ranges[-1][1], s1))
            else:
                ranges.append((s0, s1))
    return out


def step_changes_prune(*, keep_s: float = STEP_CHANGES_KEEP_S) -> None:
    """Drop the change log's rows older than `keep_s`, raising the horizon past them."""
    with connection.cursor() as cursor:
        cursor.execute(_PRUNE_SQL, [keep_s])
