"""Writes of runs, step reports and events (called by the ingest worker in its transaction),
and the run state that operators' stop and resume commands set (apps.commands)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Q
from django.utils import timezone
from psycopg.types.json import Jsonb

from apps.core.times import to_datetime
from apps.runs.changes import steps_mark_changed
from apps.runs.choices import ENDED_STATES, RunState
from apps.runs.chunks import DURATION_DECIMALS, STEP_FIELDS
from apps.runs.compaction import STEP_TYPES, steps_unseal
from apps.runs.models import Run
from apps.runs.timeline import Timeline, restart_event_counts, timeline_advance


@dataclass
class RunSeen:
    """What one drain saw of a run: its reports' (time, step), and its highest rank."""

    reports: list[tuple[datetime, int]] = field(default_factory=list)
    world_size: int = 0

    def add_step(self, step: dict[str, Any]) -> None:
        self.reports.append((to_datetime(step["ts"]), step["step"]))
        self.world_size = max(self.world_size, step["rank"] + 1)


# Steps this much newer than a run's end mean it runs again (a job restarted under the same
# name); closer ones are the last steps of ranks that ended a moment after the first one.
RUN_RESUME_AFTER_S = 60.0

# Creates the run, or locks its row (the no-op update) and reads what the walk needs.
_RUN_LOCK_SQL = """
INSERT INTO runs_run (cluster_id, name, state, restarts, world_size, created_at)
VALUES (%(cluster)s, %(name)s, 'running', 0, %(world)s, now())
ON CONFLICT (cluster_id, name) DO UPDATE SET
  world_size = GREATEST(runs_run.world_size, EXCLUDED.world_size)
RETURNING id, first_step, last_step, last_step_at, timeline_after, timeline_from, restarts,
          restart_event_at, ended_at
"""
_RUN_ADVANCE_SQL = """
UPDATE runs_run SET first_step = %(first)s, last_step = %(last)s, last_step_at = %(last_at)s,
  timeline_after = %(after)s, timeline_from = %(began)s, restarts = %(restarts)s,
  state = CASE WHEN %(resumed)s THEN 'running' ELSE state END,
  ended_at = CASE WHEN %(resumed)s THEN NULL ELSE ended_at END
WHERE id = %(id)s
"""


def runs_touch(*, seen: dict[tuple[int, str], RunSeen]) -> dict[tuple[int, str], int]:
    """Create runs on first sight and advance their timelines (apps.runs.timeline: a step
    counter that goes back starts a new timeline and counts a restart; the detectors'
    window and the run's summary follow the newest, so a resumed run that progresses is no
    hang); returns (cluster, name) → id. An ended run that steps RUN_RESUME_AFTER_S past
    its end runs again. Two statements a run, its row locked between them."""
    ids: dict[tuple[int, str], int] = {}
    resume_after = timedelta(seconds=RUN_RESUME_AFTER_S)
    with connection.connection.cursor() as cursor:
        for (cluster_id, name), run in sorted(seen.items(), key=lambda item: item[0]):
            cursor.execute(
                _RUN_LOCK_SQL, {"cluster": cluster_id, "name": name, "world": run.world_size}
            )
            run_id, *columns, ended_at = cursor.fetchone()
            before = Timeline(*columns)
            after = timeline_advance(before, run.reports)
            resumed = (
                ended_at is not None
                and after.last_step_at is not None
                and after.last_step_at > ended_at + resume_after
            )
            if after != before or resumed:
                cursor.execute(
                    _RUN_ADVANCE_SQL,
                    {
                        "id": run_id,
                        "first": after.first_step,
                        "last": after.last_step,
                        "last_at": after.last_step_at,
                        "after": after.timeline_after,
                        "began": after.timeline_from,
                        "restarts": after.restarts,
                        "resumed": resumed,
                    },
                )
            ids[cluster_id, name] = run_id
    return ids


def _restart_count(cursor: Any, run_id: int, at: datetime) -> None:
    """Count a `restart` event, unless it is the current timeline's step-back, counted
    already (apps.runs.timeline.restart_event_counts); either way it is the newest event
    counted, so that a step-back it stands for, seen later, is not counted again."""
    cursor.execute(
        "SELECT first_step, last_step, last_step_at, timeline_after, timeline_from, restarts,"
        " restart_event_at FROM runs_run WHERE id = %s FOR UPDATE",
        [run_id],
    )
    state = Timeline(*cursor.fetchone())
    counts = restart_event_counts(state, at)
    cursor.execute(
        "UPDATE runs_run SET restarts = restarts + %s,"
        " restart_event_at = GREATEST(restart_event_at, %s) WHERE id = %s",
        [1 if counts else 0, at, run_id],
    )


def _duration(seconds: float | None) -> float | None:
    """A step phase's duration as stored: to the microsecond. The phases are timed with
    perf_counter, and digits below a microsecond are noise that costs ≈ 4 B a value on disk
    (docs/contract.md); every reader (rollups, detectors, pages) reads the stored value."""
    return None if seconds is None else round(float(seconds), DURATION_DECIMALS)


class StepsStored(NamedTuple):
    """What `steps_store` wrote: the report count, and run id → (first ts, last ts), for the
    caller to mark dirty for the history rollups."""

    count: int
    ranges: dict[int, tuple[datetime, datetime]]


def steps_store(*, steps: list[tuple[int, int, dict[str, Any]]]) -> StepsStored:
    """COPY step reports given as (run id, node id, step record), in the caller's
    transaction; a report that lands in a compacted window unseals it (steps_unseal).
    Durations are stored to the microsecond (`_duration`); the stored step numbers are
    marked for the completions' refresh and in the step change log (apps.runs.changes).
    Marking the ranges for the rollups is the caller's step (the ingest store
    step), so runs never calls into history."""
    if not steps:
        return StepsStored(0, {})
    dirty: dict[int, tuple[datetime, datetime]] = {}
    numbers: dict[int, tuple[int, int]] = {}  # run → (first step, last step)
    with (
        connection.connection.cursor() as cursor,
        cursor.copy(
            f"COPY runs_stepreport ({', '.join(STEP_FIELDS)}) FROM STDIN (FORMAT BINARY)"
        ) as copy,
    ):
        copy.set_types(STEP_TYPES)
        for run_id, node_id, step in steps:
            canary = step.get("canary") or {}
            ts = to_datetime(step["ts"])
            first, last = dirty.get(run_id, (ts, ts))
            dirty[run_id] = (min(first, ts), max(last, ts))
            low, high = numbers.get(run_id, (step["step"], step["step"]))
            numbers[run_id] = (min(low, step["step"]), max(high, step["step"]))
            copy.write_row(
                (
                    run_id,
                    node_id,
                    ts,
                    step["rank"],
                    step["step"],
                    _duration(step["step_time"]),
                    _duration(step.get("data_time")),
                    _duration(step.get("h2d_time")),
                    _duration(step.get("compute_time")),
                    _duration(step.get("comm_wait")),
                    step.get("tokens"),
                    step.get("loss"),
                    step.get("grad_checksum"),
                    step.get("param_checksum"),
                    canary.get("norm"),
                    canary.get("proj") if canary else None,
                    step.get("shard"),
                    step.get("gpu"),
                )
            )
    steps_unseal(ranges=dirty, now=timezone.now())
    steps_mark_changed(steps=numbers)
    return StepsStored(len(steps), dirty)


EVENT_COLUMNS = ("ts", "kind", "step", "rank", "gpu")


def events_store(*, events: list[tuple[int, int, int | None, dict[str, Any]]]) -> int:
    """Insert events given as (cluster id, node id, run id or None, event record)."""
    if not events:
        return 0
    rows = []
    for cluster_id, node_id, run_id, event in events:
        data = {key: value for key, value in event.items() if key not in EVENT_COLUMNS}
        rows.append(
            (
                cluster_id,
                node_id,
                run_id,
                to_datetime(event["ts"]),
                event["kind"],
                event.get("step"),
                event.get("rank"),
                event.get("gpu"),
                Jsonb(data),
            )
        )
    with connection.connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO runs_runevent (cluster_id, node_id, run_id, ts, kind, step, rank, gpu,"
            " data) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )
    runs_end(
        events=[(run_id, event) for _, _, run_id, event in events if run_id is not None],
    )
    return len(rows)


def runs_end(*, events: list[tuple[int, dict[str, Any]]]) -> int:
    """Apply the run_end and restart events given as (run id, event record), oldest first,
    in the caller's transaction; returns how many changed a run.

    run_end: the run becomes `failed` or `finished` (failed wins: one rank that failed fails
    the run), unless it stepped more than RUN_RESUME_AFTER_S after the event (an old end
    replayed from a spool after a restart), and a stopped run keeps `stopped` for an event
    from before its stop (the job going down because of the stop). restart: an ended or
    stopped run runs again."""
    changed = 0
    ordered = sorted(
        ((run_id, event) for run_id, event in events if event["kind"] in ("run_end", "restart")),
        key=lambda item: (item[0], item[1]["ts"]),  # run id order: no deadlocks
    )
    with connection.connection.cursor() as cursor:
        for run_id, event in ordered:
            at = to_datetime(event["ts"])
            if event["kind"] == "restart":
                _restart_count(cursor, run_id, at)
                cursor.execute(
                    "UPDATE runs_run SET state = 'running', ended_at = NULL"
                    " WHERE id = %s AND ended_at IS NOT NULL AND ended_at <= %s",
                    [run_id, at],
                )
            else:
                cursor.execute(
                    "UPDATE runs_run SET"
                    "  state = CASE WHEN %s = 'failed' OR (state = 'failed' AND ended_at"
                    "   IS NOT NULL) THEN 'failed' ELSE 'finished' END,"
                    "  ended_at = GREATEST(ended_at, %s),"
                    "  end_message = CASE WHEN %s <> '' THEN %s ELSE end_message END"
                    " WHERE id = %s AND (last_step_at IS NULL"
                    "  OR last_step_at <= %s + make_interval(secs => %s))"
                    " AND NOT (state = 'stopped' AND ended_at IS NOT NULL AND ended_at >= %s)",
                    [
                        event.get("state"),
                        at,
                        event.get("message") or "",
                        event.get("message") or "",
                        run_id,
                        at,
                        RUN_RESUME_AFTER_S,
                        at,
                    ],
                )
            changed += cursor.rowcount
    return changed


def run_mark_stopped(*, run_id: int, since: datetime, at: datetime | None = None) -> bool:
    """A stop of the run succeeded: it becomes `stopped` (ended_at = `at`, the stop's time).

    A running run stops; so does one that ended at or after `since` (the stop's issue time:
    that run_end was the job going down because of the stop). One that ended before the stop
    was issued keeps its end. Returns whether this call changed the run (a conditional
    UPDATE: of racing callers one wins).

    The stop's time goes in ended_at, the column ingest compares step times and restart
    events with: steps more than RUN_RESUME_AFTER_S after it, or a restart event after it,
    make the run `running` again, as they do for an ended run; a run_end from before it
    leaves it stopped (runs_end)."""
    ended_by_stop = Q(state__in=ENDED_STATES, ended_at__gte=since)
    return bool(
        Run.objects.filter(pk=run_id)
        .filter(Q(state=RunState.RUNNING) | ended_by_stop)
        .update(state=RunState.STOPPED, ended_at=at or timezone.now())
    )


def run_mark_running(*, run_id: int) -> bool:
    """A resume of the run succeeded (the job was started again): a run that is not running
    runs again. Returns whether this call changed it (a conditional UPDATE)."""
    return bool(
        Run.objects.filter(pk=run_id)
        .exclude(state=RunState.RUNNING)
        .update(state=RunState.RUNNING, ended_at=None)
    )
