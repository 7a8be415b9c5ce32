"""The step reports of the detectors' window: each active run's last ALERT_STEP_WINDOW steps,
loaded positionally into StepRows (whole, or only some steps: apps.alerts.selectors.kept).
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

from apps.core.db import query_logged, server_cursor
from apps.runs.models import Run
from detectors.types import StepRow

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


def steps_load(
    runs: list[Run], *, names: dict[int, str], until: float | None
) -> dict[int, list[StepRow]]:
    """The last ALERT_STEP_WINDOW steps of every rank of each run (reported at or before
    `until`, if given), ordered by step, rank, then time, at most world size ×
    ALERT_STEP_WINDOW × STEP_REPORTS_PER_RANK_STEP reports a run: one statement, a run's
    index range each (rows become StepRows without a model)."""
    caps = {run.id: reports_cap(run) for run in runs}
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
    return step_rows(rows, names)


def reports_cap(run: Run) -> int:
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
        low = (run.last_step or 0) - settings.ALERT_STEP_WINDOW
        params += [run.id, low, timeline_after(run, until)]
        params += [] if until is None else [until]
        params.append(caps[run.id] + (0 if ordered else 1))
    return " UNION ALL ".join([branch] * len(runs)), params


def step_rows(rows: list[tuple], names: dict[int, str]) -> dict[int, list[StepRow]]:
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


def timeline_after(run: Run, until: float | None) -> datetime:
    """Reports after this are the run's current timeline (as of `until`, when replaying:
    a restart later than that had not happened yet)."""
    after = run.timeline_after
    if after is None or (until is not None and after.timestamp() >= until):
        return datetime.min.replace(tzinfo=UTC)
    return after


def steps_in_ranges(
    ranges: dict[int, list[tuple[int, int]]], *, runs: dict[int, Run], names: dict[int, str]
) -> dict[int, list[StepRow]]:
    """Every report of the run's current timeline in the given step ranges (first, last,
    inclusive), run id → StepRows ordered by step, rank, then time (as `steps_load`)."""
    branch = (
        f"(SELECT run_id, node_id, {_STEPROW_COLUMNS} FROM runs_stepreport"
        " WHERE run_id = %s AND step BETWEEN %s AND %s AND ts > %s)"
    )
    params: list[Any] = []
    for run_id, spans in ranges.items():
        for first, last in spans:
            params += [run_id, first, last, timeline_after(runs[run_id], None)]
    if not params:
        return {}
    sql = " UNION ALL ".join([branch] * (len(params) // 4))
    with query_logged(connection, sql), server_cursor() as cursor:
        cursor.execute(sql, params, binary=True, prepare=False)
        rows = cursor.fetchall()
    rows.sort(key=itemgetter(0, _STEP, _RANK, _TS))
    return step_rows(rows, names)
