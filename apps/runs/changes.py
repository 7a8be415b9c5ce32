"""Which steps of which run got new reports, for readers that keep a window between passes.

`steps_store` records, in ingest's transaction, run id → (first step, last step) of the
reports it stored, twice in one statement: a mark for the completions' refresh (claimed and
deleted by it, apps.runs.completions) and a row of the change log `runs_stepchange`, read by
transaction-id watermark (apps.core.changes says why) by any number of readers (the
detectors' windows kept by each periodic worker, apps.alerts.selectors.kept). Every writer
of new step reports must record them here: `steps_store` is the one in production (the
compaction's unseal rewrites reports already read); a test that inserts reports by hand
and evaluates a live pass calls `steps_mark_changed` as it would.
"""

from __future__ import annotations

from apps.core.changes import CHANGES_KEEP_S, ChangeLog, ChangeSnapshot
from apps.core.db import server_cursor

STEP_CHANGES = ChangeLog("runs_stepchange", "runs_stepchangehorizon")

_RECORD_SQL = """
WITH stored(run_id, s0, s1) AS (SELECT * FROM unnest(%b::int8[], %b::int8[], %b::int8[])),
marked AS (INSERT INTO runs_completiondirty (run_id, s0, s1) SELECT * FROM stored)
INSERT INTO runs_stepchange (run_id, s0, s1) SELECT * FROM stored
"""


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
    return STEP_CHANGES.snapshot()


def step_changes_since(*, run_ids: list[int], xid: int) -> dict[int, list[tuple[int, int]]]:
    """run id → its changed step ranges (first, last), merged where they overlap or touch,
    written by transactions with ids at or above `xid`."""
    if not run_ids:
        return {}
    rows = STEP_CHANGES.rows_since(
        columns="run_id, s0, s1", key="run_id", ids=run_ids, xid=xid, tail="ORDER BY run_id, s0"
    )
    out: dict[int, list[tuple[int, int]]] = {}
    for run_id, s0, s1 in rows:
        ranges = out.setdefault(run_id, [])
        if ranges and s0 <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], s1))
        else:
            ranges.append((s0, s1))
    return out


def step_changes_prune(*, keep_s: float = CHANGES_KEEP_S) -> None:
    """Drop the change log's rows older than `keep_s`, raising the horizon past them."""
    STEP_CHANGES.prune(keep_s=keep_s)
